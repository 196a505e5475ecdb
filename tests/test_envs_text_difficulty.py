"""The task families' difficulty knob: a problem of difficulty d needs exactly d tool calls, and
no generated problem is beyond the int32 calculator."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.envs.text import Arithmetic, Countdown, MultiHop, calculator

LEVELS = range(1, 6)
GENERATORS = {
    "arithmetic": lambda d: Arithmetic(d, partial_credit=False),
    "multihop": MultiHop,
}


def _capped_answer(task, calls: int) -> str:
    """The final turn of a policy that can make ``calls`` tool calls: it follows the
    demonstration that far, then answers with the last result it has."""
    results = [m.content for m in task.demonstration if m.role == "tool"]
    return f"<think>done</think><answer>{results[min(calls, len(results)) - 1]}</answer>"


@pytest.mark.parametrize("family", GENERATORS)
@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10**6), capacity=st.sampled_from(LEVELS))
def test_a_policy_of_k_calls_solves_exactly_the_problems_of_at_most_k_steps(family, seed, capacity):
    for difficulty in LEVELS:
        generator = GENERATORS[family](difficulty)
        task = generator.sample(seed)
        assert len(task.milestones) == difficulty  # one tool call per step
        solved = generator.reward.host(_capped_answer(task, capacity), task) >= 0.5
        assert solved == (difficulty <= capacity), (difficulty, capacity, task.prompt[-1])


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6), difficulty=st.sampled_from(LEVELS))
def test_generated_problems_never_overflow_the_calculator(seed, difficulty):
    for generator in (Arithmetic(difficulty), Countdown(min(difficulty + 1, 5))):
        task = generator.sample(seed)
        for message in task.demonstration:
            if message.role == "tool":
                assert not message.content.startswith("error"), message.content
        for call in (c for m in task.demonstration if m.role == "assistant" for c in m.tool_calls):
            result = calculator.evaluate_text(call.arguments["expression"], 256)
            assert result.error == calculator.OK and abs(result.value) <= calculator.INT_MAX
        assert generator.reward.host(task.demonstration[-1].content, task) == pytest.approx(1.0)
