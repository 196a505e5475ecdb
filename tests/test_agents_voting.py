"""VotingPolicy: self-consistency over the turns of another policy."""

import collections

from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import ScriptedPolicy
from agentic_jax.agents.policies.voting import VotingPolicy, turn_key
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.data.chat import Message


@given(st.lists(st.integers(0, 3), min_size=1, max_size=7))
def test_the_majority_answer_is_returned_and_every_sample_is_charged(answers):
    script = [f"thinking {i} <answer>{a}</answer>" for i, a in enumerate(answers)]
    inner = ScriptedPolicy(script)
    turn = VotingPolicy(inner, n=len(answers)).respond([Message("user", "q")], seed=10)
    winner = collections.Counter(answers).most_common(1)[0][0]  # first seen wins ties
    assert turn.text == script[answers.index(winner)]
    assert len(inner.calls) == len(answers)
    assert [c[2]["seed"] for c in inner.calls] == list(range(10, 10 + len(answers)))
    assert all(c[2]["temperature"] == 0.7 for c in inner.calls)
    one = ScriptedPolicy(script[:1]).respond([Message("user", "q")])
    assert turn.usage.prompt_tokens == len(answers) * one.usage.prompt_tokens


def test_tool_calls_vote_by_name_and_canonical_arguments():
    call = lambda expr: {"tool_calls": [{"name": "calculator", "arguments": expr}]}  # noqa: E731
    inner = ScriptedPolicy(
        [call({"expression": "1+2"}), call('{"expression": "2*3"}'), call({"expression": "2*3"})]
    )
    turn = VotingPolicy(inner, n=3).respond([Message("user", "q")])
    assert turn.tool_calls[0].arguments == {"expression": "2*3"}
    assert turn_key(turn) == ("calls", ("calculator", '{"expression": "2*3"}'))


def test_a_voting_policy_runs_an_agent_loop():
    inner = ScriptedPolicy(
        [{"tool_calls": [{"name": "calculator", "arguments": {"expression": "6*7"}}]}] * 2
        + ["<answer>42</answer>", "<answer>41</answer>"]
    )
    agent = ReActAgent(VotingPolicy(inner, n=2), tools=[calculator])
    result = agent.run("What is 6*7?")
    assert "42" in result.answer
