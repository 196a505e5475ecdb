"""Context management: the prompt always fits the window; compaction keeps must-keep facts."""

import hypothesis.strategies as st
import pytest
from hypothesis import given

from agentic_jax.agents import (
    ContextBudget,
    ContextManager,
    ContextOverflow,
    ReActAgent,
    ScriptedPolicy,
    ToolError,
    compaction_tool,
    truncate,
)
from agentic_jax.agents.context.tokens import approx_tokens, messages_tokens
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.data.chat import Message, ToolCall

words = st.text(alphabet="abcdefghij 0123456789.,\n", max_size=3000)
messages = st.lists(
    st.builds(Message, st.sampled_from(["user", "assistant", "tool"]), words), max_size=40
)


@given(
    system=words.map(lambda s: s[:400]),
    history=messages,
    retrieved=st.lists(words, max_size=4),
    window=st.integers(400, 3000),
)
def test_the_prompt_never_exceeds_the_window(system, history, retrieved, window):
    budget = ContextBudget(window=window, max_tool_output=100)
    manager = ContextManager(budget)
    manager.pin("the launch code is 0000")
    available = window - budget.tokens(budget.generation)
    for n in range(0, len(history) + 1, 7):  # as the conversation grows
        prompt = manager.build(system, history[:n], retrieved)
        assert messages_tokens(prompt) <= available
        assert "the launch code is 0000" in prompt[0].content
        assert prompt[0].role == "system" and (n == 0 or prompt[-1].role == history[n - 1].role)


def test_long_tool_outputs_are_truncated_head_and_tail():
    text = "HEAD " + "x" * 10_000 + " TAIL"
    cut = truncate(text, 100)
    assert approx_tokens(cut) <= 100 and cut.startswith("HEAD") and cut.endswith("TAIL")
    assert "characters cut" in cut
    manager = ContextManager(ContextBudget(window=4000, max_tool_output=50))
    prompt = manager.build("sys", [Message("user", "go"), Message("tool", text)])
    assert approx_tokens(prompt[-1].content) <= 50 and manager.compactions == 0


def test_old_turns_are_summarised_past_the_threshold_keeping_pinned_facts():
    budget = ContextBudget(window=1000, compact_at=0.75, keep_recent=2)
    manager = ContextManager(budget)
    manager.pin("the user's name is Ada", "budget: 300 EUR")
    history = [Message("user", f"turn {i}: " + "chatter " * 40) for i in range(12)]
    prompt = manager.build("You help.", history[:2])
    assert manager.compactions == 0 and len(prompt) == 3
    prompt = manager.build("You help.", history)
    assert manager.compactions >= 1 and manager.offset >= 2
    assert messages_tokens(prompt) <= 800 and len(prompt) == 1 + len(history) - manager.offset
    assert prompt[-2:] == history[-2:]
    system = prompt[0].content
    assert "# Summary of earlier turns" in system and "turn 0" in system
    assert "- the user's name is Ada" in system and "- budget: 300 EUR" in system


def test_summaries_never_split_a_call_from_its_result():
    call = Message("assistant", "", (ToolCall("calculator", {"expression": "1+1"}),))
    history = [
        Message("user", "q " * 700),
        Message("assistant", "a " * 10),
        call,
        Message("tool", "2"),
        Message("tool", "2"),
        Message("assistant", "done"),
    ]
    manager = ContextManager(ContextBudget(window=600, keep_recent=2))
    prompt = manager.build("s", history)
    assert manager.offset == 2  # the cut at the tool result moved back to the call
    assert prompt[1:] == history[2:]
    forward = ContextManager(ContextBudget(window=600, keep_recent=2))
    forward.build(
        "s",
        [
            Message("assistant", "q " * 700, call.tool_calls),
            Message("tool", "2"),
            Message("user", "go on"),
        ],
    )
    assert forward.offset == 2  # moving back would not advance: the result goes too
    # But the newest call and its results are never folded away (leaving the system prompt
    # alone): their text is cut to fit instead.
    newest = ContextManager(ContextBudget(window=600, keep_recent=1))
    prompt = newest.build(
        "s",
        [
            Message("user", "go"),
            Message("assistant", "q " * 700, call.tool_calls),
            Message("tool", "2 " * 700),
        ],
    )
    assert newest.offset == 1 and [m.role for m in prompt] == ["system", "assistant", "tool"]
    assert prompt[1].tool_calls == call.tool_calls and prompt[2].content.startswith("2 2")
    assert messages_tokens(prompt) <= 600 - newest.budget.tokens(newest.budget.generation)


def test_overflow_when_pinned_facts_cannot_fit():
    manager = ContextManager(ContextBudget(window=200))
    manager.pin("fact " * 400)
    with pytest.raises(ContextOverflow):
        manager.build("s", [Message("user", "hi")])


def test_the_compaction_tool_follows_its_rubric():
    manager = ContextManager()
    compact = compaction_tool(manager)
    assert "sub-task is resolved" in compact.description and "Do NOT compact" in compact.description
    with pytest.raises(ToolError, match="only once a sub-task is resolved"):
        compact(summary="half done", subtask_resolved=False)
    assert compact(summary="s", subtask_resolved=True, keep=["x = 3"]).startswith("compacted")


def test_a_model_compacts_its_own_context_and_keeps_what_it_marked():
    manager = ContextManager(ContextBudget(window=4000))
    policy = ScriptedPolicy(
        [
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "17 * 23"}}]},
            {
                "text": "Sub-task 1 is done.",
                "tool_calls": [
                    {
                        "name": "compact_context",
                        "arguments": {
                            "summary": "Computed 17 * 23.",
                            "subtask_resolved": True,
                            "keep": ["17 * 23 = 391"],
                        },
                    }
                ],
            },
            {"tool_calls": [{"name": "calculator", "arguments": {"expression": "391 + 100"}}]},
            "491",
        ]
    )
    result = ReActAgent(policy, [calculator], context=manager).run("What is 17 * 23 + 100?")
    assert result.ok and result.answer == "491"
    assert "compact_context" in policy.calls[0][1]
    after = policy.calls[2][0]  # the prompt right after compaction
    assert "- 17 * 23 = 391" in after[0].content and "Computed 17 * 23." in after[0].content
    assert all("What is 17 * 23" not in m.content for m in after[1:])  # the old turns are gone
    assert manager.pinned == ["17 * 23 = 391"] and manager.compactions == 1


def test_a_new_conversation_drops_the_summary_but_keeps_pinned_facts():
    manager = ContextManager(ContextBudget(window=1000, keep_recent=1))
    manager.pin("x = 3")
    manager.build("s", [Message("user", "chatter " * 400), Message("user", "more")])
    assert manager.summary and manager.offset == 1
    manager.new_history()
    prompt = manager.build("s", [Message("user", "next step")])
    assert prompt[1:] == [Message("user", "next step")] and "Summary" not in prompt[0].content
    assert "- x = 3" in prompt[0].content
