"""An imported instruct model's tool calls through its own chat template and tool-call format:
``ChatModel`` and the OpenAI-compatible server on a tiny random model, with the Hermes (ChatML)
and Mistral style templates of ``test_data_hf_chat`` and transformers as the prompt oracle."""

import json
import urllib.request

import jax
import jsonschema
import pytest
from test_data_hf_chat import CHATML, MISTRAL, TOOLS, _hf_tokenizer

from agentic_jax.data.chat import Message, ToolCall, ToolSpec
from agentic_jax.data.chat_template import JinjaChatTemplate
from agentic_jax.data.tokenizer import load_tokenizer
from agentic_jax.data.tool_formats import FORMATS
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.chat_model import ChatModel
from agentic_jax.inference.serving.engine import EngineConfig
from agentic_jax.inference.serving.openai_server import OpenAIServer
from agentic_jax.models import TransformerConfig, init_params

ENGINE = EngineConfig(num_slots=2, min_prefill_len=256)
SPEC = ToolSpec.from_openai(TOOLS[0])  # the prompts' tool (its city is any string)
# The tools generated against: enums keep a random model's strings short.
WEATHER = ToolSpec(
    "weather",
    "Weather in a city.",
    {"type": "object", "properties": {"city": {"enum": ["Oslo", "Rome"]}}, "required": ["city"]},
)
CLOCK = ToolSpec(
    "clock",
    "The time in a zone.",
    {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"]},
)


def _model(path, template, eos, **kwargs):
    hf = _hf_tokenizer(template, eos=eos)
    hf.save_pretrained(path)
    ours = load_tokenizer(path)
    config = TransformerConfig(
        vocab_size=ours.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1,
        head_dim=8, d_ff=32, max_seq_len=512,
    )  # fmt: skip
    params = init_params(config, jax.random.key(0))
    return hf, ChatModel(params, config, ours, ENGINE, max_tool_call_tokens=128, **kwargs)


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    hf, model = _model(tmp_path_factory.mktemp("hermes"), CHATML, "<|im_end|>")
    yield hf, model
    model.close()


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    hf, model = _model(tmp_path_factory.mktemp("mistral"), MISTRAL, "</s>")
    yield hf, model
    model.close()


HISTORY = [
    Message("system", "Be brief."),
    Message("user", "Weather in Oslo?"),
    Message("assistant", "", (ToolCall("weather", {"city": "Oslo"}),)),
    Message("tool", '{"temp_c": 3}'),
]
# The same conversation as transformers takes it: OpenAI message dicts.
HISTORY_DICTS = [
    {"role": m.role, "content": m.content}
    | {"tool_calls": [{"type": "function", "function": vars(c)} for c in m.tool_calls]}
    if m.tool_calls
    else {"role": m.role, "content": m.content}
    for m in HISTORY
]


def test_the_format_comes_from_the_template_and_tools_reach_it(hermes):
    hf, model = hermes
    assert model.tool_format is FORMATS["hermes"]
    expected = hf.apply_chat_template(
        HISTORY_DICTS, tools=TOOLS, add_generation_prompt=True, return_dict=False
    )
    assert model.prompt_ids(HISTORY, [SPEC]) == list(expected)


@pytest.mark.parametrize("choice", ["required", "weather", "clock"])
def test_a_required_call_is_constrained_to_the_hermes_format(hermes, choice):
    _, model = hermes
    tool_choice = choice if choice == "required" else {"function": {"name": choice}}
    for seed in range(2):
        reply = model.chat(
            HISTORY[:2],
            [WEATHER, CLOCK],
            tool_choice=tool_choice,
            params=SamplingParams(temperature=1.0, max_tokens=8, seed=seed),
        )
        [call] = reply.tool_calls
        assert reply.finish_reason == "tool_calls" and reply.text == ""
        spec = {"weather": WEATHER, "clock": CLOCK}[call.name]
        assert choice in ("required", call.name)
        jsonschema.validate(dict(call.arguments), spec.parameters)


def test_a_free_turn_is_read_by_the_format(hermes, monkeypatch):
    """Under ``auto`` the turn runs to EOS and is parsed: several calls, or the text as it is."""
    _, model = hermes
    calls = [ToolCall("weather", {"city": "Oslo"}), ToolCall("clock", {"zone": "UTC"})]
    eos = model.tokenizer.eos_id
    for text, expected_calls, expected_text in (
        (model.tool_format.render("Looking.", calls), calls, "Looking."),
        ('<tool_call>\n{"name": "weather", "arguments": {"ci', [], None),
        ("Just text.", [], None),
    ):
        tokens = model.tokenizer.encode(text) + [eos]
        monkeypatch.setattr(model, "_stream", lambda *a, t=tokens, s=text: (t, s, "stop"))
        seen = []
        reply = model.chat(HISTORY[:2], [SPEC, CLOCK], on_text=seen.append)
        assert list(reply.tool_calls) == expected_calls
        assert reply.text == (expected_text or text) and seen == [reply.text]
        assert reply.finish_reason == ("tool_calls" if calls == expected_calls else "stop")


def test_a_real_free_turn_and_a_tool_result_round_trip(hermes):
    _, model = hermes
    reply = model.chat(HISTORY, [SPEC], params=SamplingParams(temperature=0.0, max_tokens=4))
    assert reply.finish_reason in ("stop", "length") and not reply.tool_calls
    assert reply.prompt_tokens == len(model.prompt_ids(HISTORY, [SPEC]))


def test_a_required_call_in_the_mistral_format(mistral):
    hf, model = mistral
    assert model.tool_format is FORMATS["mistral"]
    messages = [Message("user", "Weather in Oslo?")]
    expected = hf.apply_chat_template(
        [{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS, return_dict=False
    )
    assert model.prompt_ids(messages, [SPEC]) == list(expected)
    # The constraint allows a list of calls, and a random model may go on listing them until
    # max_tool_call_tokens; what it ends is a list of valid calls.
    params = SamplingParams(temperature=1.0, max_tokens=8, seed=0)
    reply = model.chat(messages, [WEATHER], tool_choice="required", params=params)
    if reply.finish_reason == "length":
        assert reply.completion_tokens == 1 + model.max_tool_call_tokens
    else:
        assert reply.finish_reason == "tool_calls" and reply.tool_calls
    for call in reply.tool_calls:
        assert call.name == "weather"
        jsonschema.validate(dict(call.arguments), WEATHER.parameters)
    # A free turn in the format, as a Mistral model writes it, is read back into its calls.
    calls = [ToolCall("weather", {"city": "Oslo"}), ToolCall("weather", {"city": "Rome"})]
    tokens = model.tokenizer.encode(model.tool_format.render("", calls)) + [hf.eos_token_id]
    model._stream = lambda *a: (tokens, "", "stop")
    try:
        reply = model.chat(messages, [WEATHER], params=params)
    finally:
        del model._stream
    assert list(reply.tool_calls) == calls and reply.finish_reason == "tool_calls"


def test_a_template_of_no_known_format_serves_plain_chat_only(hermes, tmp_path):
    _, model = hermes
    plain = JinjaChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ValueError, match="unknown tool-call format 'x'"):
        ChatModel(model.params, model.config, model.tokenizer, ENGINE, tool_format="x")
    other = ChatModel(model.params, model.config, model.tokenizer, ENGINE, template=plain)
    try:
        assert other.tool_format is None
        with pytest.raises(RequestError, match="no known format"):
            other.chat([Message("user", "hi")], [SPEC])
        named = ChatModel(
            model.params, model.config, model.tokenizer, ENGINE, template=plain,
            tool_format="hermes",
        )  # fmt: skip
        assert named.tool_format is FORMATS["hermes"]
        named.close()
    finally:
        other.close()


def test_the_server_returns_openai_tool_calls(hermes):
    _, model = hermes
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER.openai()],
        "tool_choice": "required",
        "max_tokens": 8,
    }
    with OpenAIServer(model, host="127.0.0.1", port=0, model_name="tiny") as server:
        request = urllib.request.Request(
            server.url + "/chat/completions",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.load(response)
    [choice] = reply["choices"]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER.parameters)
