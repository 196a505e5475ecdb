"""Tool-call formats: render -> parse round-trips, malformed calls reported (never raised), the
constraint automaton of each format accepting exactly valid calls, and selection by name/model."""

import functools
import json

import gin
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.data import chat
from agentic_jax.data.tokenizer import SPECIAL_TOKENS
from agentic_jax.data.tool_formats import (
    FORMATS,
    ParsedTurn,
    ToolCall,
    format_for_model,
    tool_call_format,
)
from agentic_jax.inference.decoding.constrained import regex_constraint

# Strings with quotes, backslashes, newlines and non-ASCII text (no control characters or "<",
# which JSON would escape as \uXXXX, a spelling the schema automata do not write).
TRICKY = st.text(st.sampled_from(list('ab Z09"\\\n\t/é日€ß{}[];,:')), max_size=12)
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,7}", fullmatch=True).filter(
    lambda s: s not in ("if", "in", "is", "or", "as", "def", "for", "and", "not", "del", "try")
)
finite = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TRICKY
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TRICKY, inner, max_size=3),
    max_leaves=5,
)
keyword_calls = st.builds(ToolCall, identifiers, st.dictionaries(identifiers, finite, max_size=3))
json_calls = keyword_calls | st.builds(
    ToolCall, TRICKY.filter(bool), st.dictionaries(TRICKY, finite, max_size=3) | TRICKY
)


def _content(name: str):
    """Content each format can carry beside (or, whole-message formats, instead of) calls."""
    if name == "agentic_jax":
        return st.text(max_size=20).filter(lambda s: not any(t in s for t in SPECIAL_TOKENS))
    if name == "hermes":
        return st.text(max_size=20).filter(
            lambda s: "<tool_call>" not in s and "</tool_call>" not in s
        )
    if name == "mistral":
        return st.text(max_size=20).filter(lambda s: "[TOOL_CALLS]" not in s)
    start = {"llama3_json": ("{", "<|python_tag|>"), "pythonic": ("[",)}[name]
    return st.text(max_size=20).filter(lambda s: not s.lstrip().startswith(start))


@st.composite
def turns(draw, name):
    calls = draw(st.lists(keyword_calls if name == "pythonic" else json_calls, max_size=3))
    content = "" if calls and name in ("llama3_json", "pythonic") else draw(_content(name))
    return content, calls


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_each_format_round_trips(name):
    fmt = FORMATS[name]

    @given(turns(name))
    def check(turn):
        content, calls = turn
        assert fmt.parse(fmt.render(content, calls)) == ParsedTurn(content, tuple(calls), ())

    check()


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_several_calls_with_quotes_newlines_and_non_ascii(name):
    calls = [
        ToolCall("search", {"query": 'he said "hi"\nthen \\left', "lang": "日本語 é"}),
        ToolCall("now", {}),
        ToolCall("add", {"a": 1, "b": [2.5, None, True], "c": {"k": "</tool_call>"}}),
    ]
    content = "" if name in ("llama3_json", "pythonic") else "Let me check: ünïcode."
    text = FORMATS[name].render(content, calls)
    assert FORMATS[name].parse(text) == ParsedTurn(content, tuple(calls), ())


@pytest.mark.parametrize(
    "name, text",
    [
        ("agentic_jax", '<tool_call>\n{"name": "f", "arguments": {"a": \n</tool_call>'),
        ("agentic_jax", '<tool_call>\n{"name": "f", "arguments": {}}\n'),
        ("agentic_jax", '<tool_call>\n{"name": "f", "parameters": {}}\n</tool_call>'),
        ("hermes", 'ok\n<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'),
        ("hermes", '<tool_call>\n{"name": "f", "arguments": {}}'),
        ("hermes", '<tool_call>\n{"function": "f", "arguments": {}}\n</tool_call>'),
        ("llama3_json", '{"name": "f", "parameters": {"a": '),
        ("llama3_json", '{"name": "f", "params": {}}'),
        ("llama3_json", '{"name": "f", "parameters": {} and then'),
        ("pythonic", "[f(a=1), g(b=]"),
        ("pythonic", "[f(1)]"),
        ("pythonic", "[f(a={1, 2})]"),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "args": {}}]'),
        ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {}, "id": "short"}]'),
    ],
)
def test_malformed_calls_are_reported(name, text):
    parsed = FORMATS[name].parse(text)
    assert parsed.errors and all(isinstance(e, str) and e for e in parsed.errors)
    assert not any(call.name == "f" for call in parsed.calls)


@st.composite
def mutilated(draw, name):
    content, calls = draw(turns(name))
    text = FORMATS[name].render(content, calls)
    cut = draw(st.integers(0, len(text)))
    end = draw(st.integers(cut, len(text)))
    junk = draw(st.lists(st.sampled_from([*'{}[]"\\:;,()=<>/ ', "<tool_call>"]), max_size=4))
    junk = "".join(junk)
    return text[:cut] + junk + text[end:]


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_parse_never_raises_on_mutilated_text(name):
    fmt = FORMATS[name]

    @given(mutilated(name))
    def check(text):
        parsed = fmt.parse(text)
        assert isinstance(parsed.content, str)
        assert all(isinstance(c, ToolCall) for c in parsed.calls)
        assert all(isinstance(e, str) for e in parsed.errors)

    check()


def _old_tool_call_json(call: ToolCall) -> str:  # data.chat's renderer before the formats
    payload = json.dumps(
        {"name": call.name, "arguments": call.arguments}, ensure_ascii=False, allow_nan=False
    )
    return payload.replace("<", "\\u003c")


@given(st.lists(json_calls, max_size=3), _content("agentic_jax"))
def test_own_format_output_is_unchanged(calls, content):
    old = content + "".join(f"<tool_call>\n{_old_tool_call_json(c)}\n</tool_call>" for c in calls)
    assert FORMATS["agentic_jax"].render(content, calls) == old
    message = chat.Message("assistant", content, tuple(calls))
    assert chat.render([message]) == f"<|im_start|>assistant\n{old}<|im_end|>\n"


# ---------------------------------------------------------------------------- constraints
SPECS = (
    chat.ToolSpec(
        "weather",
        "",
        {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    ),
    chat.ToolSpec("now", "", {"type": "object", "properties": {}, "additionalProperties": False}),
)
EOS = 256
valid_calls = st.lists(
    st.builds(lambda c, d: ToolCall("weather", {"city": c, "days": d}), TRICKY, st.integers())
    | st.just(ToolCall("now", {})),
    min_size=1,
    max_size=3,
)


@functools.cache
def _automaton(name):
    """The format's calls regex as a token automaton over a vocabulary of the 256 bytes."""
    regex = FORMATS[name].call_regex(SPECS)
    constraint = regex_constraint(regex, [bytes([b]) for b in range(256)] + [None], EOS)
    return np.asarray(constraint.allowed), np.asarray(constraint.next_state), constraint.initial


def _accepts(name, text: str) -> bool:
    allowed, next_state, state = _automaton(name)
    for byte in text.encode():
        if not allowed[state, byte]:
            return False
        state = next_state[state, byte]
    return bool(allowed[state, EOS])


CONSTRAINED = sorted(set(FORMATS) - {"pythonic"})
INVALID = [
    [ToolCall("weather", {"city": 3, "days": 1})],
    [ToolCall("weather", {"city": "Oslo"})],
    [ToolCall("weather", {"days": 1, "city": "Oslo"})],
    [ToolCall("rain", {})],
    [ToolCall("now", {"x": 1})],
    [ToolCall("now", {}), ToolCall("weather", {"city": "Oslo", "days": 1.5})],
]


@pytest.mark.parametrize("name", CONSTRAINED)
def test_constraint_accepts_exactly_valid_calls(name):
    fmt = FORMATS[name]

    @given(valid_calls, st.data())
    def check(calls, data):
        text = fmt.render("", calls if name == "mistral" else calls[:1])  # Mistral: a list
        assert _accepts(name, text)
        cut = data.draw(st.integers(0, len(text) - 1))
        assert not _accepts(name, text[:cut])  # a prefix is no call yet
        assert not _accepts(name, text + "x")

    check()
    for calls in INVALID:
        assert not _accepts(name, fmt.render("", calls if name == "mistral" else calls[-1:]))


def test_pythonic_calls_are_not_constrained():
    with pytest.raises(ValueError, match="pythonic"):
        FORMATS["pythonic"].call_regex(SPECS)


def test_bad_schema_and_no_tools_are_value_errors():
    with pytest.raises(ValueError, match="at least one tool"):
        FORMATS["hermes"].call_regex(())
    with pytest.raises(ValueError, match="'bad'"):
        FORMATS["hermes"].call_regex([chat.ToolSpec("bad", "", {"type": "wizard"})])


# ---------------------------------------------------------------------------- selection
@pytest.mark.parametrize(
    "model_type, template, expected",
    [
        ("qwen2", None, "hermes"),
        ("llama", None, "llama3_json"),
        ("mixtral", None, "mistral"),
        (None, "{{ '<tool_call>\\n' + tool_call | tojson }}", "hermes"),
        ("llama", "{{- '[TOOL_CALLS][' }}", "mistral"),
        (None, "{%- if message.role == 'ipython' %}", "llama3_json"),
        (None, "<tool_call>...<tool_result>", "agentic_jax"),
    ],
)
def test_format_for_model(model_type, template, expected):
    assert format_for_model(model_type, template).name == expected


def test_unknown_formats_are_value_errors():
    with pytest.raises(ValueError, match="gpt2"):
        format_for_model("gpt2", "{{ messages }}")
    with pytest.raises(ValueError, match="'nope'"):
        tool_call_format("nope")


def test_tool_call_format_is_gin_configurable():
    assert tool_call_format().name == "agentic_jax"
    with gin.unlock_config():
        gin.parse_config("tool_call_format.name = 'mistral'")
    try:
        assert tool_call_format() is FORMATS["mistral"]
    finally:
        gin.clear_config()
