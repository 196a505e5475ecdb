"""The OpenAI API's options through the server, driven by the official ``openai`` client on the
server tests' tiny model: structured replies validated against their schema, ``n`` choices
(streamed too), log-probabilities equal to a direct ``ChatModel`` call's, ``stop``, ``seed``,
``max_completion_tokens``, cached prompt tokens, tool choices and several calls per turn as
stream deltas, ``/metrics`` read back with prometheus-client's parser, GenAI spans in
OpenTelemetry's in-memory exporter, and unsupported fields refused by name."""

import json
import urllib.error
import urllib.request

import jsonschema
import pytest
import test_serving_hf_tools
import test_serving_server
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from prometheus_client.parser import text_string_to_metric_families

from agentic_jax.data.chat import Message, ToolCall
from agentic_jax.inference.serving.chat_model import sampling_params
from agentic_jax.inference.serving.openai_server import OpenAIServer

openai = pytest.importorskip("openai")

MODEL = test_serving_server.MODEL
model_dir, model, weather = (
    test_serving_server.model_dir,
    test_serving_server.model,
    test_serving_server.weather,
)
MESSAGES = test_serving_server.MESSAGES
# A Hugging Face (Hermes) template's model and tool, for several calls in one turn.
hermes, WEATHER = test_serving_hf_tools.hermes, test_serving_hf_tools.WEATHER
GREEDY = dict(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8)
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["oslo", "rome"]}, "hot": {"type": "boolean"}},
    "required": ["city", "hot"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def spans():
    return InMemorySpanExporter()


@pytest.fixture(scope="module")
def server(model, spans):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    with OpenAIServer(model, model_name=MODEL, tracer_provider=provider) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


def _messages() -> list[Message]:
    return [Message(m["role"], m["content"]) for m in MESSAGES]


def _stream(client, **kwargs) -> list:
    return list(client.chat.completions.create(**kwargs, stream=True))


def _streamed_texts(chunks) -> dict[int, str]:
    """Each choice's text, joined from its chunks."""
    texts: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
    return texts


def _metrics(server, headers=None) -> dict:
    """``{(sample name, labels): value}`` of ``GET /metrics``, parsed by prometheus-client."""
    url = server.url.removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=headers or {}), timeout=30
    ) as r:
        assert r.headers.get_content_type() == "text/plain"
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _value(samples, name, **labels) -> float:
    return samples.get((f"agentic_jax_{name}", tuple(sorted(labels.items()))), 0.0)


def test_json_schema_replies_validate_against_their_schema(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY, "strict": True}}
    kwargs = dict(model=MODEL, messages=MESSAGES, response_format=fmt, max_tokens=40)
    for seed in range(2):
        reply = client.chat.completions.create(**kwargs, temperature=1, seed=seed).choices[0]
        assert reply.finish_reason == "stop"
        jsonschema.validate(json.loads(reply.message.content), CITY)
        streamed = _streamed_texts(_stream(client, **kwargs, temperature=1, seed=seed))
        assert streamed == {0: reply.message.content}
    plain = client.chat.completions.create(**GREEDY, response_format={"type": "text"})
    assert (
        plain.choices[0].message.content
        == client.chat.completions.create(**GREEDY).choices[0].message.content
    )
    as_object = client.chat.completions.create(**GREEDY, response_format={"type": "json_object"})
    text = as_object.choices[0].message.content
    assert text.startswith("{")
    if as_object.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    for bad in ({"type": "xml"}, {"type": "json_schema", "json_schema": {"name": "x"}}):
        with pytest.raises(openai.BadRequestError, match="response_format"):
            client.chat.completions.create(**GREEDY, response_format=bad)


def test_n_choices_are_returned_and_streamed_with_their_index(client, model):
    kwargs = dict(model=MODEL, messages=MESSAGES, temperature=1, max_tokens=6, seed=7, n=3)
    whole = client.chat.completions.create(**kwargs)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    # Choice i is sampled with seed + i, as a direct call with that seed samples it.
    direct = [
        model.chat(_messages(), params=sampling_params(temperature=1, max_tokens=6, seed=7 + i))
        for i in range(3)
    ]
    assert [c.message.content for c in whole.choices] == [g.text for g in direct]
    assert len({g.text for g in direct}) > 1
    assert whole.usage.completion_tokens == sum(g.completion_tokens for g in direct)
    chunks = _stream(client, **kwargs, stream_options={"include_usage": True})
    assert _streamed_texts(chunks) == {c.index: c.message.content for c in whole.choices}
    finishes = {c.index: c.finish_reason for ch in chunks for c in ch.choices if c.finish_reason}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # Completions stream several prompts and samples too, choice p * n + i.
    batch = dict(model=MODEL, prompt=["The cat", "A dog"], max_tokens=4, temperature=0, n=2)
    texts = [c.text for c in client.completions.create(**batch).choices]
    streamed = {}
    for chunk in client.completions.create(**batch, stream=True):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == dict(enumerate(texts)) and texts[0] == texts[1] != texts[2] == texts[3]


def test_stop_and_seed(client):
    text = client.chat.completions.create(**{**GREEDY, "max_tokens": 12}).choices[0].message.content
    stop = text[4:6]
    cut = client.chat.completions.create(**{**GREEDY, "max_tokens": 12}, stop=[stop]).choices[0]
    assert cut.message.content == text[: text.index(stop)] and cut.finish_reason == "stop"
    sampled = dict(model=MODEL, messages=MESSAGES, temperature=1, max_tokens=8)
    replies = [
        client.chat.completions.create(**sampled, seed=seed).choices[0].message.content
        for seed in (1, 1, 2)
    ]
    assert replies[0] == replies[1] != replies[2]


def test_chat_logprobs_equal_the_engines_streamed_and_not(client, model):
    k = 3
    reply = client.chat.completions.create(**GREEDY, logprobs=True, top_logprobs=k).choices[0]
    direct = model.chat(
        _messages(), params=sampling_params(temperature=0, max_tokens=8), top_logprobs=k
    )
    assert reply.message.content == direct.text
    content = reply.logprobs.content
    expected = model.openai_logprobs(direct)["content"]
    assert _logprobs(content) == pytest.approx(_logprobs(expected), abs=1e-5)
    assert [c.token for c in content] == [e["token"] for e in expected]
    assert all(len(c.top_logprobs) == k for c in content)
    chunks = _stream(client, **GREEDY, logprobs=True, top_logprobs=k)
    streamed = [e for ch in chunks for c in ch.choices if c.logprobs for e in c.logprobs.content]
    assert [e.token for e in streamed] == [c.token for c in content]
    assert _logprobs(streamed) == pytest.approx(_logprobs(content), abs=1e-5)
    # A chunk carries the tokens generated since the last: their text leads what was sent.
    ids, count, sent = [t.token for t in direct.logprobs], 0, ""
    for chunk in chunks:
        for c in chunk.choices:
            count += len(c.logprobs.content) if c.logprobs else 0
            sent += c.delta.content or ""
            assert model.tokenizer.decode(ids[:count], skip_special_tokens=True).startswith(sent)
    assert count == len(ids) and sent == direct.text
    assert client.chat.completions.create(**GREEDY).choices[0].logprobs is None


def _logprobs(entries) -> list[float]:
    """Each entry's logprob and its alternatives' (OpenAI objects or their dicts)."""
    if entries and isinstance(entries[0], dict):
        return [
            v for e in entries for v in (e["logprob"], *(t["logprob"] for t in e["top_logprobs"]))
        ]
    return [v for e in entries for v in (e.logprob, *(t.logprob for t in e.top_logprobs))]


def test_completion_logprobs_in_the_legacy_shape(client, model):
    kwargs = dict(model=MODEL, prompt="The cat", max_tokens=6, temperature=0, logprobs=2)
    choice = client.completions.create(**kwargs).choices[0]
    direct = model.complete("The cat", sampling_params(temperature=0, max_tokens=6), top_logprobs=2)
    lp = choice.logprobs
    assert lp.token_logprobs == pytest.approx([t.logprob for t in direct.logprobs], abs=1e-5)
    assert lp.tokens == [model.tokenizer.decode([t.token]) for t in direct.logprobs]
    assert "".join(lp.tokens) == choice.text == direct.text
    assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
    for top, token in zip(lp.top_logprobs, direct.logprobs, strict=True):
        expected = {model.tokenizer.decode([i]): v for i, v in token.top}
        assert len(top) <= 2 and top == pytest.approx(expected, abs=1e-5)
    streamed = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(**kwargs, stream=True):
        for key, values in streamed.items():
            values += getattr(chunk.choices[0].logprobs, key)
    assert streamed["tokens"] == lp.tokens and streamed["text_offset"] == lp.text_offset
    assert streamed["token_logprobs"] == pytest.approx(lp.token_logprobs, abs=1e-5)


def test_max_completion_tokens_and_cached_prompt_tokens(server, client):
    kwargs = dict(model=MODEL, messages=MESSAGES, temperature=0)
    reply = client.chat.completions.create(**kwargs, max_completion_tokens=3)
    assert reply.usage.completion_tokens == 3 and reply.choices[0].finish_reason == "length"
    same = client.chat.completions.create(**kwargs, max_completion_tokens=3, max_tokens=3)
    assert same.choices[0].message.content == reply.choices[0].message.content
    with pytest.raises(openai.BadRequestError) as differ:
        client.chat.completions.create(**kwargs, max_completion_tokens=3, max_tokens=4)
    assert differ.value.param == "max_completion_tokens"
    # The same prompt again: its blocks are in the prefix cache, as the engine's counter says.
    before = _metrics(server)
    again = client.chat.completions.create(**kwargs, max_completion_tokens=3)
    hits = _value(_metrics(server), "prefix_cache_hits_total") - _value(
        before, "prefix_cache_hits_total"
    )
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached == hits <= again.usage.prompt_tokens


def test_tool_choices_streamed_and_not(client):
    tools = [weather.spec.openai()]
    kwargs = dict(model=MODEL, messages=MESSAGES, tools=tools, temperature=0, max_tokens=8)
    named = {"type": "function", "function": {"name": "weather"}}
    for choice in ("required", named):
        [call] = (
            client.chat.completions.create(**kwargs, tool_choice=choice)
            .choices[0]
            .message.tool_calls
        )
        jsonschema.validate(json.loads(call.function.arguments), weather.parameters)
        chunks = _stream(client, **kwargs, tool_choice=choice)
        deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or ()]
        assert deltas[0].id.startswith("call_") and deltas[0].function.name == "weather"
        assert "".join(d.function.arguments for d in deltas) == call.function.arguments
    none = client.chat.completions.create(**kwargs, tool_choice="none").choices[0]
    assert none.message.tool_calls is None and none.finish_reason in ("stop", "length")
    auto = client.chat.completions.create(**kwargs, tool_choice="auto").choices[0]
    assert auto.finish_reason in ("stop", "length", "tool_calls")


def test_several_tool_calls_in_one_turn_as_stream_deltas(hermes):
    """A Hugging Face format's turn with two calls (its free turn scripted, as in
    ``test_serving_hf_tools``): two calls in the reply, and as deltas with indexes 0 and 1."""
    hf, chat_model = hermes
    calls = [ToolCall("weather", {"city": "Oslo"}), ToolCall("weather", {"city": "Rome"})]
    turn = chat_model.tokenizer.encode(chat_model.tool_format.render("", calls))
    chat_model._stream = lambda *a: (turn + [hf.eos_token_id], "", "stop")
    kwargs = dict(
        model=MODEL, messages=MESSAGES, tools=[WEATHER.openai()], tool_choice="auto", max_tokens=8
    )
    try:
        with OpenAIServer(chat_model, model_name=MODEL) as server:
            client = openai.OpenAI(base_url=server.url, api_key="-", max_retries=0, timeout=60)
            reply = client.chat.completions.create(**kwargs).choices[0]
            chunks = _stream(client, **kwargs)
    finally:
        del chat_model._stream
    got = [(c.function.name, json.loads(c.function.arguments)) for c in reply.message.tool_calls]
    assert got == [(c.name, dict(c.arguments)) for c in calls]
    assert reply.finish_reason == "tool_calls"
    deltas = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or ()]
    arguments = {0: "", 1: ""}
    for d in deltas:
        arguments[d.index] += d.function.arguments or ""
    assert [d.index for d in deltas if d.id] == [0, 1]
    assert [json.loads(arguments[i]) for i in (0, 1)] == [dict(c.arguments) for c in calls]


def test_metrics_count_requests_and_the_tokens_reported(server, client):
    before = _metrics(server)
    usages = [
        client.chat.completions.create(**GREEDY, n=2).usage,
        client.completions.create(model=MODEL, prompt="A dog", max_tokens=5).usage,
    ]
    *_, last = _stream(client, **GREEDY, stream_options={"include_usage": True})
    usages.append(last.usage)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(**{**GREEDY, "temperature": 9})
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(server.url + "/made-up/path", timeout=30)
    after = _metrics(server)

    def grew(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert grew("prompt_tokens_total") == sum(u.prompt_tokens for u in usages)
    assert grew("generation_tokens_total") == sum(u.completion_tokens for u in usages)
    chat = "/v1/chat/completions"
    assert grew("requests_total", endpoint=chat, status="200") == 2
    assert grew("requests_total", endpoint=chat, status="400") == 1
    assert grew("requests_total", endpoint="/v1/completions", status="200") == 1
    assert grew("requests_total", endpoint="other", status="404") == 1
    assert grew("requests_total", endpoint="/metrics", status="200") == 1  # the first read
    assert ("agentic_jax_requests_waiting", ()) in after
    assert ("agentic_jax_requests_running", ()) in after


def test_metrics_need_the_api_key_when_there_is_one(model):
    with OpenAIServer(model, model_name=MODEL, api_key="k") as server:
        url = server.url.removesuffix("/v1") + "/metrics"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url, timeout=30)
        assert denied.value.code == 401
        samples = _metrics(server, {"Authorization": "Bearer k"})
    assert _value(samples, "requests_total", endpoint="/metrics", status="401") >= 1


def test_model_calls_are_genai_spans(client, spans):
    spans.clear()
    chat = client.chat.completions.create(**GREEDY, top_p=0.9)
    text = client.completions.create(model=MODEL, prompt="A dog", max_tokens=3, temperature=0.5)
    _stream(client, **GREEDY)
    with pytest.raises(openai.BadRequestError):  # a bad schema fails inside the span
        client.chat.completions.create(**GREEDY, response_format={"type": "xml"})
    by_name = {}
    for span in spans.get_finished_spans():
        by_name.setdefault(span.name, []).append(span)
    [chat_span, stream_span, failed] = by_name[f"chat {MODEL}"]
    [text_span] = by_name[f"text_completion {MODEL}"]
    for span, reply, operation, temperature, top_p, max_tokens in [
        (chat_span, chat, "chat", 0.0, 0.9, 8),
        (text_span, text, "text_completion", 0.5, 1.0, 3),
    ]:
        attributes = dict(span.attributes)
        assert {
            gen_ai.GEN_AI_OPERATION_NAME: operation,
            gen_ai.GEN_AI_REQUEST_MODEL: MODEL,
            gen_ai.GEN_AI_REQUEST_MAX_TOKENS: max_tokens,
            gen_ai.GEN_AI_REQUEST_TEMPERATURE: temperature,
            gen_ai.GEN_AI_REQUEST_TOP_P: top_p,
            gen_ai.GEN_AI_RESPONSE_ID: reply.id,
            gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: (reply.choices[0].finish_reason,),
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: reply.usage.prompt_tokens,
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: reply.usage.completion_tokens,
        }.items() <= attributes.items()
    assert stream_span.attributes[gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS] == 8
    assert not failed.status.is_ok and failed.events[0].name == "exception"


@pytest.mark.parametrize(
    "path, change, param",
    [
        ("/chat/completions", {"logit_bias": {"1": 5}}, "logit_bias"),
        ("/chat/completions", {"prediction": {"type": "content"}}, "prediction"),
        ("/chat/completions", {"user": "me"}, "user"),
        ("/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ("/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/chat/completions", {"modalities": ["audio"]}, "modalities"),
        ("/completions", {"echo": True}, "echo"),
        ("/completions", {"best_of": 2}, "best_of"),
        ("/completions", {"logprobs": 21}, "logprobs"),
    ],
)
def test_unsupported_fields_are_400s_naming_them(server, path, change, param):
    base = {"model": MODEL, "prompt": "hi"} if path == "/completions" else GREEDY
    request = urllib.request.Request(
        server.url + path,
        json.dumps({**base, **change}).encode(),
        {"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    error = json.loads(refused.value.read())["error"]
    assert refused.value.code == 400 and error["param"] == param and param in error["message"]
