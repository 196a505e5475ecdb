"""Delphi rounds on scripted panelists: anonymous feedback (its quartiles against the standard
library's), revision until convergence, and the stops when the panel does not converge."""

import collections
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.agents import ScriptedPolicy, StopReason
from agentic_jax.agents.multi_agent import Delphi, TeamLimits, TeamMember, panel_summary


def panel(*answers_per_member):
    return [
        TeamMember(name, ScriptedPolicy([f"ANSWER: {a}" for a in answers]))
        for name, answers in zip(["alice", "bob", "carol", "dave"], answers_per_member)
    ]


def user_turns(member):
    return [call[0][-1].content for call in member.policy.calls]


def test_numeric_estimates_converge_to_the_median_once_the_spread_is_within_tolerance():
    members = panel([10, 18, 20], [20, 20, 20], [60, 30, 22])
    result = Delphi(members, tolerance=2).run("How many?")
    assert result.ok and result.answer == "20" and result.rounds == 3
    assert result.artifacts["rounds"][0] == {"alice": "10", "bob": "20", "carol": "60"}
    assert result.count("estimate") == 9 and result.count("feedback") == 2
    second = user_turns(members[0])[1]
    assert "Your previous answer: 10" in second
    assert "- 10 (1 of 3)\n- 20 (1 of 3)\n- 60 (1 of 3)\n" in second
    q1, median, q3 = statistics.quantiles([10, 20, 60], n=4, method="inclusive")
    assert f"median {median:g}, interquartile range {q1:g} to {q3:g}" in second


@given(
    st.lists(st.sampled_from(["Paris", "paris", "Lyon", "Nice", "3", "4.5"]), min_size=1),
    st.randoms(use_true_random=False),
)
def test_the_feedback_counts_each_answer_whatever_the_order_of_the_panel(answers, random):
    summary = panel_summary(answers)
    assert summary == panel_summary(random.sample(answers, len(answers)))
    counted = collections.Counter(a.lower() for a in answers)
    expected = sorted(counted.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = summary.splitlines()
    assert lines[: len(counted)] == [f"- {a} ({n} of {len(answers)})" for a, n in expected]
    assert len(lines) == len(counted) + all(a[0].isdigit() for a in answers)  # median line


def test_later_prompts_name_no_panelist():
    members = panel(["Paris", "Paris"], ["Lyon", "Paris"], ["Paris", "Paris"])
    result = Delphi(members).run("Capital of France?")
    assert result.ok and result.answer == "Paris" and result.rounds == 2
    later = [turn for m in members for turn in user_turns(m)[1:]]
    assert len(later) == 3
    assert all(name not in turn for turn in later for name in ("alice", "bob", "carol"))
    assert "- paris (2 of 3)\n- lyon (1 of 3)" in later[1]


def test_a_panel_that_keeps_disagreeing_stops_at_max_rounds_with_the_median():
    members = panel([1, 2, 3], [10, 9, 8], [30, 30, 30])
    limits = TeamLimits(max_rounds=3, patience=5)
    result = Delphi(members, limits=limits).run("q")
    assert result.stop_reason is StopReason.MAX_ROUNDS and result.answer == "8"
    assert "no consensus after max_rounds=3" in result.detail
    assert result.count("estimate") == 9


def test_a_panel_that_stops_revising_ends_without_progress():
    members = panel(["a", "a", "a"], ["b", "b", "b"])
    result = Delphi(members, limits=TeamLimits(max_rounds=5, patience=2)).run("q")
    assert result.stop_reason is StopReason.NO_PROGRESS and result.rounds == 3
    assert result.answer == "a" and "2 distinct answers" in result.detail


def test_a_panel_needs_two_members_and_a_tolerance_that_is_a_number():
    with pytest.raises(ValueError, match="at least two panelists"):
        Delphi(panel([1]))
    with pytest.raises(ValueError, match="tolerance must be a non-negative number"):
        Delphi(panel([1], [2]), tolerance=float("nan"))
