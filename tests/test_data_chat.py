"""ChatML template: render/parse are inverse, and the assistant mask covers exactly the replies."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.data.chat import (
    Message,
    ToolCall,
    as_message,
    parse,
    parse_assistant,
    render,
    render_ids,
)
from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.tokenizer import IM_END, SPECIAL_TOKENS, train_tokenizer

plain_text = st.text(max_size=40).filter(lambda s: not any(t in s for t in SPECIAL_TOKENS))
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=15),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=6,
)
json_objects = st.dictionaries(st.text(max_size=8), json_values, max_size=3)
# Text arguments: JSON objects (parsed) or what a model wrote that is none (kept as text).
tool_calls = st.builds(
    ToolCall,
    st.text(min_size=1, max_size=12),
    json_objects | json_objects.map(json.dumps) | st.text(max_size=12),
)
messages = st.one_of(
    st.builds(Message, st.sampled_from(["system", "user", "tool"]), plain_text),
    st.builds(
        Message, st.just("assistant"), plain_text, st.lists(tool_calls, max_size=2).map(tuple)
    ),
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    return train_tokenizer(path, files=corpus_files("heldout"), vocab_size=400)


def test_render_format():
    conversation = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [{"name": "weather", "arguments": {"city": "<Oslo>"}}],
        },
        {"role": "tool", "content": '{"temp_c": 3}'},
    ]
    text = render(conversation, add_generation_prompt=True)
    assert text == (
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n"
        "<|im_start|>assistant\nChecking.<tool_call>\n"
        '{"name": "weather", "arguments": {"city": "\\u003cOslo>"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>tool\n<tool_result>\n{"temp_c": 3}\n</tool_result><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    assert parse(text) == [
        Message("user", "Weather in Oslo?"),
        Message("assistant", "Checking.", (ToolCall("weather", {"city": "<Oslo>"}),)),
        Message("tool", '{"temp_c": 3}'),
    ]


@given(st.lists(messages, max_size=5), st.booleans())
def test_parse_inverts_render(conversation, generation_prompt):
    assert parse(render(conversation, add_generation_prompt=generation_prompt)) == conversation


@given(st.lists(messages, min_size=1, max_size=4), st.booleans())
def test_assistant_mask_covers_exactly_the_replies(tokenizer, conversation, generation_prompt):
    ids, mask = render_ids(conversation, tokenizer, add_generation_prompt=generation_prompt)
    assert ids.dtype == mask.dtype == np.int32 and ids.shape == mask.shape
    assert ids[0] == tokenizer.bos_id and mask[0] == 0
    text = render(conversation, add_generation_prompt=generation_prompt)
    assert tokenizer.decode(ids[1:]) == text
    # Each run of mask == 1 is one assistant turn: body + <|im_end|>, nothing before or after.
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    runs = [tokenizer.decode(ids[a:b]) for a, b in zip(edges[::2], edges[1::2])]
    header = "<|im_start|>assistant\n"
    expected = [render([m])[len(header) : -1] for m in conversation if m.role == "assistant"]
    assert runs == expected
    assert all(run.endswith(IM_END) for run in runs)


def test_generation_prompt_is_a_prefix_of_the_training_ids(tokenizer):
    history = [Message("system", "Be brief."), Message("user", "Hi")]
    reply = Message("assistant", "\n\n  Hello!", (ToolCall("greet", {"n": 1}),))
    prompt, _ = render_ids(history, tokenizer, add_generation_prompt=True)
    full, mask = render_ids(history + [reply], tokenizer)
    np.testing.assert_array_equal(full[: len(prompt)], prompt)
    assert mask[: len(prompt)].sum() == 0 and mask[len(prompt) : -1].all() and mask[-1] == 0
    generated = tokenizer.decode(full[len(prompt) : -1])
    assert parse_assistant(generated) == reply


@given(st.text(min_size=1, max_size=12), json_objects)
def test_openai_style_json_text_arguments_are_parsed(name, arguments):
    wire = {"role": "assistant", "tool_calls": [{"name": name, "arguments": json.dumps(arguments)}]}
    assert as_message(wire) == Message("assistant", "", (ToolCall(name, arguments),))


def test_arguments_that_are_no_json_object_stay_text():
    for text in ('{"city": "Os', "[1, 2]", "null"):
        conversation = [Message("assistant", "", (ToolCall("f", text),))]
        assert parse(render(conversation)) == conversation
        assert conversation[0].tool_calls[0].arguments == text


def test_parse_assistant_accepts_model_whitespace():
    text = 'ok<tool_call> {"name": "f",\n "arguments": {}} </tool_call>'
    assert parse_assistant(text) == Message("assistant", "ok", (ToolCall("f", {}),))


@pytest.mark.parametrize(
    "bad",
    [
        [Message("user", "hi <|im_end|>")],
        [Message("wizard", "hi")],
        [Message("user", "hi", (ToolCall("f"),))],
        [Message("assistant", "", (ToolCall("f", [1]),))],
    ],
)
def test_render_rejects_invalid_messages(bad):
    with pytest.raises(ValueError):
        render(bad)


@pytest.mark.parametrize(
    "text",
    [
        "hello",
        "<|im_start|>user\nhi",
        "<|im_start|>user\nhi<|im_end|>",
        "<|im_start|>tool\nno wrapper<|im_end|>\n",
        "<|im_start|>assistant\n<tool_call>\nnot json\n</tool_call><|im_end|>\n",
        '<|im_start|>assistant\n<tool_call>\n{"name": 1}\n</tool_call><|im_end|>\n',
        '<|im_start|>assistant\n<tool_call>\n{"name": "f"}\n<|im_end|>\n',
    ],
)
def test_parse_rejects_malformed_text(text):
    with pytest.raises(ValueError):
        parse(text)
