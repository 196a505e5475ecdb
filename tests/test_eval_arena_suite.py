"""`agentic-jax eval --suite arena`: scripted contestants that solve known subsets of the problems,
battles decided by the verifier and by a scripted judge against a hand count, the ratings'
order, the report files, resuming, and the contestants' checks (the CLI's included)."""

import itertools

import numpy as np
import pytest
from scripted_answers import OracleJudge, Solver

from agentic_jax.cli import main
from agentic_jax.envs.text import Arithmetic
from agentic_jax.eval.suites.arena_suite import ArenaSuite
from agentic_jax.eval.suites.judge_suite import JudgeSuite
from agentic_jax.eval.suites.run import evaluate
from agentic_jax.eval.suites.suite import Suite

SUITE = Suite(name="a", generators=(Arithmetic(1, use_tools=False),), num_tasks=6)
TASKS = [t for t, _, _ in SUITE.problems()]
SOLVES = {"strong": set(range(6)), "middle": {0, 1, 2}, "weak": {0}}


def contestants():
    return {name: Solver(right, TASKS) for name, right in SOLVES.items()}


def hand_count():
    """Each pair's winner on each problem: the one that solved it when the other did not; the
    same wrong answer earns the same reward, so two failures (or two solutions) tie."""
    names = list(SOLVES)
    out = []
    for item, (a, b) in itertools.product(range(6), itertools.combinations(names, 2)):
        solved_a, solved_b = item in SOLVES[a], item in SOLVES[b]
        out.append("tie" if solved_a == solved_b else "A" if solved_a else "B")
    return out


def test_the_verifier_decides_the_battles_and_the_ratings_order_the_contestants(tmp_path):
    players = contestants()
    suite = ArenaSuite(tasks=SUITE, resamples=200)
    result = evaluate(tmp_path, policy=players, suite=suite, progress=False)
    assert result["schedule"] == {"problems": 6, "pairs": 3, "battles": 18, "decided": 18}
    assert result["battle_counts"] == [12, 12, 12]
    assert [b["winner"] for b in result["battles"]] == hand_count()
    assert [(b["a"], b["b"]) for b in result["battles"][:3]] == list(
        itertools.combinations(SOLVES, 2)
    )
    for key in ("ratings", "style_ratings"):
        rating, low, high = (np.array(result[key][k]) for k in ("rating", "low", "high"))
        assert list(np.argsort(-rating)) == [0, 1, 2], key
        assert np.all(low <= rating + 1e-6) and np.all(rating <= high + 1e-6)
    assert list(np.argsort(-np.array(result["elo"]))) == [0, 1, 2]
    # middle vs weak: middle solved 1 and 2 alone, the other 4 problems tie: (2 + 4 / 2) / 6.
    assert result["win_rates"][1][2] == pytest.approx(4 / 6)
    assert result["win_rates"][0][0] is None
    assert {n: s["success"] for n, s in result["success"].items()} == {
        "strong": 1.0,
        "middle": 0.5,
        "weak": pytest.approx(1 / 6),
    }
    for name in ("results.json", "report.md", "ratings.png", "win_rates.png"):
        assert (tmp_path / name).exists(), name
    assert (tmp_path / "ratings.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "report.md").read_text()
    assert "| 1 | strong |" in report and "18 battles (18 decided)" in report
    assert [p.calls for p in players.values()] == [6, 6, 6]
    # Resuming plays nothing again, whatever the order the contestants come in.
    again = contestants()
    evaluate(tmp_path, policy=dict(reversed(again.items())), suite=suite, progress=False)
    assert [p.calls for p in again.values()] == [0, 0, 0]


def test_a_judge_decides_the_battles_in_both_orders_and_is_not_asked_twice(tmp_path):
    judge = OracleJudge(TASKS)
    suite = ArenaSuite(tasks=SUITE, judge=judge, judge_name="oracle", resamples=200)
    result = evaluate(tmp_path, policy=contestants(), suite=suite, progress=False)
    assert [b["winner"] for b in result["battles"]] == hand_count()
    assert result["position_bias"]["inconsistent"] == 0
    assert result["judged_by"]["judge"] == "oracle"
    assert 0 < judge.calls < 2 * 18  # identical conversations (equal answers) are asked once
    again = OracleJudge(TASKS)
    evaluate(
        tmp_path,
        policy=contestants(),
        suite=ArenaSuite(tasks=SUITE, judge=again, judge_name="oracle", resamples=200),
        progress=False,
    )
    assert again.calls == 0


def test_contestants_are_checked_before_anything_runs(tmp_path):
    suite = ArenaSuite(tasks=SUITE)
    with pytest.raises(ValueError, match="at least two contestants, got 1"):
        evaluate(tmp_path, policy={"only": Solver(set(), TASKS)}, suite=suite)
    with pytest.raises(ValueError, match="mapping of names to policies"):
        evaluate(tmp_path, policy=Solver(set(), TASKS), suite=suite)
    with pytest.raises(ValueError, match="3 models for 2 endpoints"):
        evaluate(
            tmp_path,
            endpoint=["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"],
            model=["x", "y", "z"],
            suite=suite,
        )
    with pytest.raises(ValueError, match="more than once"):
        evaluate(tmp_path, checkpoint=[str(tmp_path)] * 2, suite=suite)
    with pytest.raises(ValueError, match="give --checkpoint once"):
        evaluate(tmp_path, checkpoint=["a", "b"], suite=JudgeSuite(tasks=SUITE))


def test_the_eval_verb_takes_the_arenas_contestants_flag_by_flag(tmp_path, capsys):
    out = ["--out", str(tmp_path / "out")]
    missing = [str(tmp_path / "missing_a"), str(tmp_path / "missing_b")]
    with pytest.raises(FileNotFoundError, match="missing_a"):  # both reach the arena
        main(
            ["eval", "--suite", "arena", "--checkpoint", missing[0], "--checkpoint", missing[1]]
            + out
        )
    with pytest.raises(ValueError, match="give --checkpoint once"):
        main(
            ["eval", "--suite", "judge", "--checkpoint", missing[0], "--checkpoint", missing[1]]
            + out
        )
    with pytest.raises(SystemExit):
        main(["eval", "--suite", "arena"] + out)
    assert "eval needs --checkpoint or --endpoint" in capsys.readouterr().err
