"""``BUILTIN_JINJA``: the built-in chat template in Jinja renders what ``data.chat`` renders.

Hypothesis conversations in every message shape the two accept (``Message`` objects, dicts with
bare or OpenAI-nested tool calls, arguments as a mapping or as JSON text), with quotes,
newlines, ``<`` and non-ASCII text, tools given as ``ToolSpec`` or OpenAI dicts, with and
without a system message, tools and the generation prompt.  The export side (transformers
rendering it) is in ``test_hf_export_tools.py``.
"""

import json

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.data import chat
from agentic_jax.data.chat_template import (
    BUILTIN_JINJA,
    BuiltinChatTemplate,
    JinjaChatTemplate,
    chat_template,
)
from agentic_jax.data.tokenizer import IM_END, SPECIAL_TOKENS, Tokenizer

JINJA = JinjaChatTemplate(BUILTIN_JINJA)

TEXT = st.text(
    st.sampled_from(list("ab \"'\n\t\\{}[]<>/:,é漢😀")) | st.characters(exclude_categories=("Cs",)),
    max_size=12,
).filter(lambda s: not any(t in s for t in SPECIAL_TOKENS))
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
).filter(lambda v: "Infinity" not in json.dumps(v))
ARGUMENTS = st.dictionaries(TEXT, JSON, max_size=3)


@st.composite
def tool_calls(draw):
    name, arguments = draw(TEXT.filter(bool)), draw(ARGUMENTS)
    if draw(st.booleans()):  # the OpenAI API's arguments: JSON text
        arguments = json.dumps(arguments, ensure_ascii=False)
    call = {"name": name, "arguments": arguments}
    return draw(st.sampled_from([call, {"type": "function", "function": call}]))


@st.composite
def messages(draw):
    role = draw(st.sampled_from(["user", "assistant", "tool"]))
    content = draw(TEXT)
    calls = draw(st.lists(tool_calls(), max_size=2)) if role == "assistant" else []
    if draw(st.booleans()):
        return chat.Message(role, content, tuple(map(chat.as_tool_call, calls)))
    message = {"role": role, "content": None if calls and not content else content}
    return message | ({"tool_calls": calls} if calls else {})


@st.composite
def tools(draw):
    spec = chat.ToolSpec(draw(TEXT.filter(bool)), draw(TEXT), draw(ARGUMENTS))
    return draw(
        st.sampled_from(
            [spec, spec.openai(), {"type": "function", "function": {"name": spec.name}}]
        )
    )


@settings(max_examples=60)
@given(
    system=st.none() | TEXT,
    turns=st.lists(messages(), min_size=1, max_size=4),
    specs=st.none() | st.lists(tools(), max_size=2),
    add_generation_prompt=st.booleans(),
)
def test_the_jinja_source_renders_what_the_python_renderer_does(
    system, turns, specs, add_generation_prompt
):
    conversation = ([{"role": "system", "content": system}] if system is not None else []) + turns
    tool_specs = [chat.ToolSpec.from_openai(s) if isinstance(s, dict) else s for s in specs or []]
    expected = chat.render(
        chat.with_tools(conversation, tool_specs), add_generation_prompt=add_generation_prompt
    )
    text, spans = JINJA.render_with_spans(conversation, specs, add_generation_prompt)
    assert text == expected
    assert text == BuiltinChatTemplate().render(conversation, specs, add_generation_prompt)
    # the {% generation %} spans are the assistant turns the SFT mask trains on
    assistant = [chat.as_message(m) for m in turns if chat.as_message(m).role == "assistant"]
    assert [text[lo:hi] for lo, hi in spans] == [
        chat.TOOL_FORMAT.render(m.content, m.tool_calls) + IM_END for m in assistant
    ]


@pytest.mark.parametrize(
    "conversation, error",
    [
        ([{"role": "robot", "content": "hi"}], "unknown role"),
        ([{"role": "user", "content": "a <|im_end|> b"}], "reserved token"),
        ([{"role": "tool", "content": "<tool_result>"}], "reserved token"),
        (
            [{"role": "user", "content": "", "tool_calls": [{"name": "f", "arguments": {}}]}],
            "only assistant messages carry tool calls",
        ),
    ],
)
def test_the_jinja_source_refuses_what_the_python_renderer_refuses(conversation, error):
    with pytest.raises(ValueError, match=error):
        chat.render(conversation)
    with pytest.raises(ValueError, match=error):
        JINJA.render(conversation)


def test_a_tokenizer_carrying_the_builtin_source_trains_with_the_python_renderer():
    tokenizer = Tokenizer(
        tokenizers.Tokenizer(tokenizers.models.BPE()), chat_template=BUILTIN_JINJA
    )
    assert isinstance(chat_template(tokenizer), BuiltinChatTemplate)
    assert chat_template(tokenizer, "tokenizer") == JINJA
