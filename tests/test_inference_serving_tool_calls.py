"""Tool calls through the OpenAI-compatible server on the server tests' tiny model, driven by the
official ``openai`` client: arguments streamed piece by piece as they are decoded (joined, and
accumulated by the client's own stream state, they are the unstreamed reply), several calls per
turn of this project's template (``parallel_tool_calls: false``: the first alone), a client that
leaves during a call's arguments freeing its slot, and wrong-typed fields refused by name."""

import http.client
import json

import jsonschema
import pytest
import test_serving_asgi
import test_serving_server
from hypothesis import given
from hypothesis import strategies as st
from openai.lib.streaming.chat import ChatCompletionStreamState

from agentic_jax.data.chat import ToolSpec
from agentic_jax.inference.serving.openai_server import OpenAIServer, ServerLimits

openai = pytest.importorskip("openai")

MODEL, weather = test_serving_server.MODEL, test_serving_server.weather
# The server tests' tiny model (module fixtures).
model_dir, model = test_serving_server.model_dir, test_serving_server.model
TOOLS = [weather.spec.openai()]
ASK = dict(model=MODEL, messages=test_serving_server.MESSAGES, tools=TOOLS, max_tokens=8)
# The first seed at which the model makes several calls in one turn (seeds 0..SEEDS-1 tried).
SEEDS = 8


@pytest.fixture(scope="module")
def server(model):
    with OpenAIServer(model, model_name=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def _calls(message) -> list[tuple[str, str]]:
    return [(c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def _streamed(client, **kwargs):
    """``(the tool-call deltas, the message the openai client's own stream state accumulates
    from the chunks, its finish reason)``."""
    state = ChatCompletionStreamState(input_tools=TOOLS)
    deltas = []
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        state.handle_chunk(chunk)
        deltas += [d for c in chunk.choices for d in c.delta.tool_calls or ()]
    choice = state.get_final_completion().choices[0]
    return deltas, choice.message, choice.finish_reason


def test_arguments_stream_piece_by_piece_and_join_to_the_reply(client):
    kwargs = dict(ASK, tool_choice="required", temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0]
    [(name, arguments)] = _calls(whole.message)
    jsonschema.validate(json.loads(arguments), weather.parameters)
    deltas, message, finish = _streamed(client, **kwargs)
    opening, *pieces = deltas
    assert (opening.index, opening.type, opening.function.name) == (0, "function", name)
    assert opening.id.startswith("call_") and opening.function.arguments == ""
    assert len(pieces) > 1 and all(p.index == 0 and p.id is None for p in pieces)
    assert "".join(p.function.arguments for p in pieces) == arguments
    assert _calls(message) == _calls(whole.message) and finish == whole.finish_reason
    assert message.content == whole.message.content


def test_several_calls_in_one_turn_streamed_and_not(client, model):
    """This project's template: after a call, the model chooses another or the turn's end."""
    kwargs = dict(ASK, tool_choice="required", temperature=1)
    replies = (
        (s, client.chat.completions.create(**kwargs, seed=s).choices[0]) for s in range(SEEDS)
    )
    seed, several = next((s, r) for s, r in replies if len(r.message.tool_calls) > 1)
    assert several.finish_reason == "tool_calls"
    assert 1 < len(several.message.tool_calls) <= model.max_tool_calls
    for _, arguments in _calls(several.message):
        jsonschema.validate(json.loads(arguments), weather.parameters)
    deltas, message, finish = _streamed(client, **kwargs, seed=seed)
    assert _calls(message) == _calls(several.message) and finish == several.finish_reason
    assert [d.index for d in deltas if d.id] == list(range(len(several.message.tool_calls)))
    # At most one: the same first call, and the turn ends there.
    one = client.chat.completions.create(**kwargs, seed=seed, parallel_tool_calls=False)
    assert _calls(one.choices[0].message) == _calls(several.message)[:1]
    _, message, finish = _streamed(client, **kwargs, seed=seed, parallel_tool_calls=False)
    assert _calls(message) == _calls(several.message)[:1] and finish == "tool_calls"


# A call whose arguments need hundreds of tokens: a string of at least LONG letters or spaces.
LONG = 3000
ESSAY = ToolSpec(
    "essay",
    "Writes an essay.",
    {
        "type": "object",
        "properties": {"text": {"type": "string", "pattern": f"^[a-z ]{{{LONG},}}$"}},
        "required": ["text"],
        "additionalProperties": False,
    },
)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_that_leaves_during_a_calls_arguments_frees_its_slot(model, monkeypatch, stream):
    engine = model.engine
    monkeypatch.setattr(model, "max_tool_call_tokens", 900)
    longest = max(len(model.tokenizer.decode([i])) for i in range(model.tokenizer.vocab_size))
    needed = LONG // longest  # the fewest steps the whole call would take
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Write."}],
        "tools": [ESSAY.openai()],
        "tool_choice": "required",
        "temperature": 0,
        "stream": stream,
    }
    limits = ServerLimits(max_concurrent_requests=1)
    with OpenAIServer(model, model_name=MODEL, limits=limits) as server:
        model._constraint([ESSAY])  # built before the clock starts
        start = engine.step_count
        connection = http.client.HTTPConnection(*server.address, timeout=60)
        connection.request("POST", "/v1/chat/completions", json.dumps(body))
        if stream:  # the call has opened: its name is out
            response = connection.getresponse()
            assert any(b'"tool_calls"' in line for line in iter(response.readline, b""))
        else:
            assert test_serving_asgi.wait_until(engine.has_unfinished)
        connection.close()
        assert test_serving_asgi.wait_until(
            lambda: not engine.has_unfinished() and server.requests_generating == 0
        )
        assert engine.step_count - start < needed
        assert model.loop.health()["requests_in_flight"] == 0


WRONG_TYPES = {
    "seed": [False, True, "1", 1.5],
    "n": ["2", 2.0, True],
    "temperature": ["1", True, [1]],
    "max_tokens": ["8", 8.0],
    "logprobs": [1, "true"],
    "parallel_tool_calls": [0, "false"],
    "stream": [1, "true"],
}


@given(
    st.sampled_from(sorted(WRONG_TYPES)).flatmap(
        lambda f: st.tuples(st.just(f), st.sampled_from(WRONG_TYPES[f]))
    )
)
def test_a_value_of_the_wrong_json_type_is_a_400_naming_its_field(server, field_value):
    field, value = field_value
    status, _, raw = test_serving_asgi.request(
        server, "POST", "/v1/chat/completions", {**ASK, field: value}
    )
    error = json.loads(raw)["error"]
    assert status == 400 and error["param"] == field and error["message"].startswith(field)
