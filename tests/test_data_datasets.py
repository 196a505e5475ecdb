"""Dataset files people already have: each format, in JSONL and Parquet, reads into the same
records; a broken record names its file, line and field; the trainers consume them."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import make_model_dir

from agentic_jax.data.chat import Message, ToolCall, ToolSpec
from agentic_jax.data.datasets import (
    Conversation,
    DatasetError,
    Preference,
    PromptTask,
    Unpaired,
    read_conversations,
    read_dataset,
    read_preferences,
    read_prompts,
    read_unpaired,
)
from agentic_jax.data.tokenizer import IM_END, load_tokenizer
from agentic_jax.post_training.pairs import pair_splits, record_pairs
from agentic_jax.post_training.preference import train_preference
from agentic_jax.post_training.reward import train_reward_model
from agentic_jax.post_training.sft import chat_examples
from agentic_jax.post_training.tasks import TaskSpec

WEATHER = {
    "name": "weather",
    "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
ARGUMENTS = {"city": 'Zürich "Süd"\nnorth'}
OPENAI = {
    "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": json.dumps(ARGUMENTS)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 3}'},
        {"role": "assistant", "content": "3 °C."},
    ],
    "tools": [{"type": "function", "function": WEATHER}],
}
LEGACY = {
    "messages": [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Weather in Zürich?"},
        {
            "role": "assistant",
            "content": "",
            "function_call": {"name": "weather", "arguments": json.dumps(ARGUMENTS)},
        },
        {"role": "function", "name": "weather", "content": '{"temp_c": 3}'},
        {"role": "assistant", "content": "3 °C."},
    ],
    "functions": [WEATHER],
}
SHAREGPT = {
    "conversations": [
        {"from": "system", "value": "Be terse."},
        {"from": "human", "value": "Weather in Zürich?"},
        {"from": "function_call", "value": json.dumps({"name": "weather", "arguments": ARGUMENTS})},
        {"from": "observation", "value": '{"temp_c": 3}'},
        {"from": "gpt", "value": "3 °C."},
    ],
    "tools": json.dumps([WEATHER]),
}
CONVERSATION = Conversation(
    (
        Message("system", "Be terse."),
        Message("user", "Weather in Zürich?"),
        Message("assistant", "", (ToolCall("weather", ARGUMENTS),)),
        Message("tool", '{"temp_c": 3}'),
        Message("assistant", "3 °C."),
    ),
    (ToolSpec(WEATHER["name"], WEATHER["description"], WEATHER["parameters"]),),
)

QUESTION = [{"role": "system", "content": "Add."}, {"role": "user", "content": "What is 2 + 2?"}]
PREFERENCE_FORMS = {
    "text": {"prompt": "What is 2 + 2?", "chosen": "Four.", "rejected": "Five."},
    "messages": {
        "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
        "chosen": [{"role": "assistant", "content": "Four."}],
        "rejected": [{"role": "assistant", "content": "Five."}],
    },
    "implicit messages": {
        "chosen": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "Four."},
        ],
        "rejected": [
            {"role": "user", "content": "What is 2 + 2?"},
            {"role": "assistant", "content": "Five."},
        ],
    },
    "implicit text": {"chosen": "What is 2 + 2? Four.", "rejected": "What is 2 + 2? Five."},
}
PREFERENCE = Preference(
    (Message("user", "What is 2 + 2?"),),
    (Message("assistant", "Four."),),
    (Message("assistant", "Five."),),
)


def write(path, records):
    """``records`` as JSONL or, for a ``.parquet`` path, as a Parquet table."""
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(records), path)
    else:
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("form", [OPENAI, LEGACY, SHAREGPT], ids=["openai", "legacy", "sharegpt"])
def test_one_conversation_in_openai_legacy_and_sharegpt_forms_reads_equal(tmp_path, suffix, form):
    path = write(tmp_path / f"chats{suffix}", [form, form])
    chats = read_conversations(path)
    assert chats == [CONVERSATION, CONVERSATION]
    where = "row 1" if suffix == ".parquet" else "line 2"
    assert chats[1].source == (str(path), where)


def test_content_as_text_parts_reads_as_text(tmp_path):
    parts = [{"type": "text", "text": "3 "}, {"type": "text", "text": "°C."}]
    record = _set(OPENAI, ("messages", 4, "content"), parts)
    assert read_conversations(write(tmp_path / "c.jsonl", [record])) == [CONVERSATION]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize("form", list(PREFERENCE_FORMS))
def test_preference_text_messages_and_implicit_prompt_forms_read_equal(tmp_path, suffix, form):
    path = write(tmp_path / f"pairs{suffix}", [PREFERENCE_FORMS[form]])
    assert read_preferences(path) == [PREFERENCE]
    assert read_dataset(path) == [PREFERENCE]  # the keys say it is a preference file


def test_implicit_prompt_is_the_longest_shared_message_prefix(tmp_path):
    chosen = [*QUESTION, {"role": "assistant", "content": "4"}]
    rejected = [*QUESTION, {"role": "assistant", "content": "5"}, {"role": "user", "content": "?"}]
    (pair,) = read_preferences(
        write(tmp_path / "p.jsonl", [{"chosen": chosen, "rejected": rejected}])
    )
    assert pair.prompt == (Message("system", "Add."), Message("user", "What is 2 + 2?"))
    assert pair.rejected == (Message("assistant", "5"), Message("user", "?"))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_kto_and_rl_prompt_records(tmp_path, suffix):
    kto = [
        {"prompt": QUESTION, "completion": [{"role": "assistant", "content": "4"}], "label": True},
        {"prompt": QUESTION, "completion": [{"role": "assistant", "content": "5"}], "label": False},
    ]
    prompt = (Message("system", "Add."), Message("user", "What is 2 + 2?"))
    assert read_unpaired(write(tmp_path / f"kto{suffix}", kto)) == [
        Unpaired(prompt, (Message("assistant", "4"),), True),
        Unpaired(prompt, (Message("assistant", "5"),), False),
    ]
    rl = [{"prompt": "What is 2 + 2?", "answer": "4", "verifier": "exact"}]
    assert read_prompts(write(tmp_path / f"rl{suffix}", rl)) == [
        PromptTask((Message("user", "What is 2 + 2?"),), "4", "exact")
    ]


def _set(record, path, value):
    """A deep copy of ``record`` with the value at ``path`` (keys and indices) replaced."""
    record = json.loads(json.dumps(record))
    inner = record
    for key in path[:-1]:
        inner = inner[key]
    inner[path[-1]] = value
    return record


# (good record, where to break it, the bad value, the field the error must name)
BREAKAGES = [
    (OPENAI, ("messages", 1, "role"), "robot", "messages[1].role"),
    (OPENAI, ("messages", 1, "content"), 7, "messages[1].content"),
    (
        OPENAI,
        ("messages", 2, "tool_calls", 0, "function", "arguments"),
        '{"city": ',
        "messages[2].tool_calls[0].function.arguments",
    ),
    (
        OPENAI,
        ("messages", 2, "tool_calls", 0, "function", "name"),
        3,
        "messages[2].tool_calls[0].function.name",
    ),
    (OPENAI, ("messages", 2, "tool_calls", 0, "type"), "code", "messages[2].tool_calls[0].type"),
    (OPENAI, ("messages", 3, "tool_call_id"), "call_9", "messages[3].tool_call_id"),
    (OPENAI, ("messages", 4, "content"), [{"type": "image_url"}], "messages[4].content[0]"),
    (OPENAI, ("tools", 0), "weather", "tools[0]"),
    (
        LEGACY,
        ("messages", 2, "function_call", "arguments"),
        "[1, 2]",
        "messages[2].function_call.arguments",
    ),
    (SHAREGPT, ("conversations", 2, "value"), "weather(city)", "conversations[2].value"),
    (SHAREGPT, ("conversations", 0, "from"), "narrator", "conversations[0].from"),
    (SHAREGPT, ("tools",), "[{", "tools"),
    (PREFERENCE_FORMS["text"], ("chosen",), 4, "chosen"),
    (PREFERENCE_FORMS["messages"], ("rejected", 0, "role"), "bot", "rejected[0].role"),
    (PREFERENCE_FORMS["implicit text"], ("rejected",), "No shared words", "prompt"),
    ({"prompt": "Q", "completion": "A", "label": True}, ("label",), "yes", "label"),
    ({"prompt": "Q", "answer": "4"}, ("answer",), None, "answer"),
    ({"prompt": "Q", "answer": "4"}, ("verifier",), 3, "verifier"),
]


@settings(max_examples=40, deadline=None)
@given(breakage=st.sampled_from(BREAKAGES), good_before=st.integers(0, 3), data=st.data())
def test_a_broken_record_names_its_file_line_and_field(
    tmp_path_factory, breakage, good_before, data
):
    record, where, value, field = breakage
    blank = data.draw(st.booleans())  # blank lines are skipped but still counted
    lines = [json.dumps(record)] * good_before + ([""] if blank else [])
    lines.append(json.dumps(_set(record, where, value)))
    path = tmp_path_factory.mktemp("broken") / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError) as error:
        read_dataset(path)
    line = good_before + blank + 1
    assert (error.value.path, error.value.where, error.value.field) == (
        str(path),
        f"line {line}",
        field,
    )
    assert f"{path}, line {line}, field {field!r}" in str(error.value)


def test_parquet_errors_name_the_row_and_bad_json_names_the_line(tmp_path):
    path = write(
        tmp_path / "chats.parquet", [OPENAI, _set(OPENAI, ("messages", 0, "role"), "robot")]
    )
    with pytest.raises(DatasetError, match=r"chats.parquet, row 1, field 'messages\[0\].role'"):
        read_conversations(path)
    path = tmp_path / "chats.jsonl"
    path.write_text(json.dumps(OPENAI) + "\n{oops\n")
    with pytest.raises(DatasetError, match=r"chats\.jsonl, line 2: not JSON"):
        read_conversations(path)
    with pytest.raises(
        DatasetError, match=r"line 1: expected a record of \('openai', 'sharegpt'\)"
    ):
        read_conversations(write(tmp_path / "pairs.jsonl", [PREFERENCE_FORMS["text"]]))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("model")
    make_model_dir(path, max_seq_len=320)
    return path


SPEC = TaskSpec(num_train=2, num_heldout=1, max_length=96, action_length=16)


def test_pair_masks_cover_the_completion_only(tmp_path, model_dir):
    tokenizer = load_tokenizer(model_dir / "tokenizer.json")
    earlier = [{"role": "assistant", "content": "Sure."}, {"role": "user", "content": "So?"}]
    record = {**PREFERENCE_FORMS["messages"], "prompt": [*QUESTION, *earlier]}
    pairs = record_pairs(read_preferences(write(tmp_path / "p.jsonl", [record])), tokenizer, 96)
    for side, text in (("chosen", "Four."), ("rejected", "Five.")):
        ids, mask = pairs[side][0], pairs[f"{side}_mask"][0]
        assert tokenizer.decode(ids[mask == 1].tolist()) == text + IM_END
        assert tokenizer.decode(ids[ids > 0].tolist()).count("Sure.") == 1


def test_sft_and_reward_data_and_a_dpo_step_take_the_files(tmp_path, model_dir):
    tokenizer = load_tokenizer(model_dir / "tokenizer.json")
    chats = read_conversations(write(tmp_path / "chats.jsonl", [SHAREGPT, LEGACY]))
    assert chats[0] == chats[1]
    assert chats[0].rendered_messages()[0].content.startswith("Be terse.\n\n# Tools")
    (example, _) = chat_examples(chats, tokenizer, seq_len=300)
    trained = example["targets"][example["loss_mask"] == 1].tolist()
    assert tokenizer.decode(trained).endswith("3 °C." + IM_END)
    pairs = str(write(tmp_path / "pairs.jsonl", list(PREFERENCE_FORMS.values())))
    train, heldout = pair_splits(SPEC, tokenizer, pairs)  # what train_reward_model reads too
    assert heldout is None and (train["chosen"] == train["chosen"][:1]).all()
    common = {"init_from": str(model_dir), "steps": 1, "tasks": SPEC, "progress": False}
    with pytest.raises(ValueError, match="set heldout_pairs_file"):
        train_reward_model(str(tmp_path / "rm"), pairs_file=pairs, eval_every=1, **common)
    dpo = train_preference(str(tmp_path / "dpo"), pairs_file=pairs, prompts_per_step=2, **common)
    assert np.isclose(dpo["loss"], np.log(2), atol=1e-5)  # the first step: policy = reference
