"""A ReAct run that replays an earlier one (``react.Replay``, the web UI's retry from a step):
the recorded turns and results stand in for the policy and the tools, so the live part sees the
same conversation the earlier run had at that step, and nothing before it runs again."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.agents.loops.react import ReActAgent, Replay
from agentic_jax.agents.policies.base import AssistantMessage, ScriptedPolicy, Usage
from agentic_jax.agents.tools.base import tool
from agentic_jax.agents.tools.budget import Budget
from agentic_jax.agents.tools.executor import ToolResult
from agentic_jax.data.chat import ToolCall


def counting_tool(ran: list):
    @tool
    def count(x: int) -> str:
        """Counts a call."""
        ran.append(x)
        return f"counted {x}"

    return count


def turn(*xs: int) -> dict:
    return {
        "text": f"counting {xs}",
        "tool_calls": [{"name": "count", "arguments": {"x": x}} for x in xs],
    }


def recorded(trace: list[dict], step: int, call: int | None) -> Replay:
    """The turns and results of a trace before model turn ``step`` (or before its call number
    ``call``), read back as the UI reads its events; results of turn ``step`` are those of its
    first calls, counted as the trace has them."""
    turns = [e for e in trace if e["kind"] == "model_call"]
    last = step if call is not None else step - 1
    replayed = [
        AssistantMessage(
            e["text"],
            [ToolCall(c["name"], c["arguments"]) for c in e["tool_calls"]],
            Usage(e["prompt_tokens"], e["completion_tokens"]),
            e["finish_reason"],
        )
        for e in turns[:last]
    ]
    results = [
        ToolResult(ToolCall(e["name"], e["arguments"]), e["content"], e["status"])
        for e in trace
        if e["kind"] == "tool_call" and e["step"] < step
    ]
    if call:  # the first ``call`` calls of turn ``step`` that ran (none were redirected here)
        results += [
            ToolResult(ToolCall(e["name"], e["arguments"]), e["content"], e["status"])
            for e in trace
            if e["kind"] == "tool_call" and e["step"] == step
        ][:call]
    return Replay(replayed, results, {"retry_of": "first", "from_step": step})


@settings(max_examples=25, deadline=None)
@given(
    turns=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=2), min_size=1, max_size=4),
    data=st.data(),
)
def test_a_replayed_run_asks_the_policy_again_with_the_same_conversation(turns, data):
    """Arguments drawn from three values repeat, so the loop detector redirects some calls:
    the replay must rebuild its notes too."""
    script = [turn(*xs) for xs in turns] + ["done"]
    ran: list[int] = []
    first = ScriptedPolicy(script)
    original = ReActAgent(first, [counting_tool(ran)], budget=Budget(max_steps=10)).run("count")
    steps = len(first.calls)
    step = data.draw(st.integers(1, steps), label="step")
    # The live part gets the rest of the script again.
    again = ScriptedPolicy(script[step - 1 :])
    ran_again: list[int] = []
    agent = ReActAgent(again, [counting_tool(ran_again)], budget=Budget(max_steps=10))
    replay = recorded(list(original.trace), step, None)
    result = agent.run("count", replay=replay)
    assert again.calls[0][0] == first.calls[step - 1][0]  # the conversation at that step
    assert [c[0] for c in again.calls] == [c[0] for c in first.calls[step - 1 :]]
    assert result.messages == original.messages and result.answer == original.answer
    assert ran_again == ran[len(replay.results) :]  # only the live steps' tools ran
    assert result.trace[0]["retry_of"] == "first" and result.trace[0]["from_step"] == step
    kinds = [(e["kind"], e.get("step")) for e in result.trace]
    assert kinds == [(e["kind"], e.get("step")) for e in original.trace]


def test_a_replay_from_a_tool_call_runs_that_call_and_the_rest_of_its_turn():
    ran: list[int] = []
    first = ScriptedPolicy([turn(1), turn(2, 3), "done"])
    original = ReActAgent(first, [counting_tool(ran)]).run("count")
    again = ScriptedPolicy(["done again"])
    ran_again: list[int] = []
    result = ReActAgent(again, [counting_tool(ran_again)]).run(
        "count", replay=recorded(list(original.trace), 2, 1)
    )
    assert ran == [1, 2, 3] and ran_again == [3]  # call 1 of turn 2 and after, live
    assert len(again.calls) == 1 and again.calls[0][0] == first.calls[2][0]
    assert result.answer == "done again"


def test_a_record_that_does_not_match_the_replayed_turns_is_refused():
    stray = ToolResult(ToolCall("count", {"x": 9}), "counted 9")
    replay = Replay([AssistantMessage("", [ToolCall("count", {"x": 1})])], [stray])
    agent = ReActAgent(ScriptedPolicy(["done"]), [counting_tool([])])
    with pytest.raises(ValueError, match=r"calls count\(\{\"x\": 1\}\) where its record has"):
        agent.run("count", replay=replay)
