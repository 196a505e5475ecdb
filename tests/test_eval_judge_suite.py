"""`agentic-jax eval --suite judge`: scripted answers of known quality graded by scripted judges
through the whole suite (answers, both-order verdicts, panel, report, resume), the shipped eval
configs, and the self-judged default through the CLI on a tiny checkpoint."""

import dataclasses

import gin
import pytest
from scripted_answers import SUITE, FirstJudge, OracleJudge, Solver
from tiny_models import task_model_dir

import agentic_jax.registry  # noqa: F401  (every configurable, as the CLI has them)
from agentic_jax import config as gin_config
from agentic_jax.cli import main
from agentic_jax.eval.judge import PAIRWISE_PROMPT, POINTWISE_PROMPT
from agentic_jax.eval.stats import cohen_kappa
from agentic_jax.eval.suites.arena_suite import ArenaSuite
from agentic_jax.eval.suites.judge_suite import JudgeSuite
from agentic_jax.eval.suites.judging import environment_variable
from agentic_jax.eval.suites.report import load_result
from agentic_jax.eval.suites.run import evaluate

PAIRWISE_V2 = dataclasses.replace(PAIRWISE_PROMPT, version="2-test")


def test_known_answers_get_the_expected_scores_a_first_position_judge_is_flagged_and_resume_asks_nothing(
    tmp_path,
):
    solver, oracle, first = Solver(right={0, 1}), OracleJudge(), FirstJudge()
    suite = JudgeSuite(
        tasks=SUITE, judges={"oracle": oracle, "first": first}, pairwise_prompt=PAIRWISE_V2
    )
    result = evaluate(tmp_path, policy=solver, suite=suite, progress=False)
    assert result["evaluated"] == "Solver" and not result["self_judged"]
    assert result["verifier"]["success"] == 0.5
    # Two right answers scored 9, two wrong ones 2.
    graded = result["pointwise"]["oracle"]
    assert graded["scored"] == 4 and graded["mean_score"][0] == pytest.approx(5.5)
    assert graded["mean_score_verifier_right"] == 9 and graded["mean_score_verifier_wrong"] == 2
    # Against the (right) reference: a right answer ties, a wrong one loses in both orders.
    compared = result["pairwise"]["oracle"]
    assert (compared["wins"], compared["ties"], compared["losses"]) == (0, 2, 2)
    assert compared["win_rate"][0] == pytest.approx(0.25)
    assert compared["position_bias"]["inconsistent"] == 0
    # Preferring the first position whatever is shown: every pair's orders disagree.
    biased = result["pairwise"]["first"]
    assert biased["position_bias"]["inconsistent"] == biased["position_bias"]["pairs"] == 4
    assert biased["position_bias"]["first_position_wins"] == 8
    assert (biased["ties"], biased["win_rate"][0]) == (4, 0.5)
    # The hashes recorded are the prompts'.
    assert result["judge_prompts"]["pointwise"]["sha256"] == POINTWISE_PROMPT.sha256
    assert result["judge_prompts"]["pairwise"]["sha256"] == PAIRWISE_V2.sha256
    assert PAIRWISE_V2.sha256 != PAIRWISE_PROMPT.sha256
    assert {p["prompt_sha256"] for p in result["pairwise"].values()} == {PAIRWISE_V2.sha256}
    assert graded["prompt_sha256"] == POINTWISE_PROMPT.sha256
    # The panel's kappa is the library's, on the replies the judges gave once.
    kappa = result["panel"]["pointwise"]["cohen_kappa"]["oracle vs first"]
    assert kappa == pytest.approx(
        cohen_kappa([9, 9, 2, 2], [5] * 4, weights="quadratic", labels=list(range(1, 11)))
    )
    # A right answer is the reference itself: both orders are one conversation, asked once.
    assert oracle.calls == first.calls == 4 + 2 * 4 - 2 and solver.calls == 4
    assert len((tmp_path / "judgements.jsonl").read_text().splitlines()) == 2 * 10
    report = (tmp_path / "report.md").read_text()
    assert (
        "| `first` | 4 / 4 | 0.500 [0.500, 0.500] | 0 / 4 / 0 | 0.500 | 4 / 4 | 8 / 0 / 0 |"
        in report
        and "Self-judged" not in report
    )
    assert (tmp_path / "judge.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Resuming asks neither the model nor a judge again, and reports the same.
    written = (tmp_path / "results.json").read_text()
    again = [Solver(right={0, 1}), OracleJudge(), FirstJudge()]
    suite = dataclasses.replace(suite, judges={"oracle": again[1], "first": again[2]})
    evaluate(tmp_path, policy=again[0], suite=suite, progress=False)
    assert [p.calls for p in again] == [0, 0, 0]
    assert (tmp_path / "results.json").read_text() == written


def test_with_no_judge_the_model_judges_itself_and_failed_judge_calls_are_asked_again(tmp_path):
    model = Solver(right={0}, judging="fail")
    result = evaluate(tmp_path, policy=model, suite=JudgeSuite(tasks=SUITE), progress=False)
    assert result["self_judged"] and result["judges"] == ["self: Solver"]
    # (answer 0 is the reference: both of its orders are one conversation)
    assert result["judge_failures"]["self: Solver"]["failed_calls"] == 4 + 2 * 4 - 1
    assert result["pointwise"]["self: Solver"]["unparseable"] == 4
    assert result["pairwise"]["self: Solver"]["undecided"] == 4
    assert "> **Self-judged**" in (tmp_path / "report.md").read_text()
    # Failures are not journaled: a resumed run asks them again, and only them.
    model = Solver(right={0}, judging="Score: 7\nVerdict: tie")
    result = evaluate(tmp_path, policy=model, suite=JudgeSuite(tasks=SUITE), progress=False)
    assert model.calls == 11 and result["pointwise"]["self: Solver"]["mean_score"][0] == 7


@pytest.mark.parametrize("name", sorted(p.stem for p in gin_config.config_dir().glob("eval_*.gin")))
def test_every_shipped_eval_config_parses(name):
    gin_config.parse([name], [])
    try:
        if name in ("eval_judge", "eval_arena"):
            kind = {"eval_judge": JudgeSuite, "eval_arena": ArenaSuite}[name]
            assert gin.query_parameter("eval.evaluate.suite").selector == f"eval.{kind.__name__}"
            suite = kind()
            assert suite.tasks.name == name.removeprefix("eval_") and suite.tasks.problems()
    finally:
        gin.clear_config()


def test_a_judge_key_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_KEY", "secret")
    assert environment_variable("JUDGE_TEST_KEY") == "secret"
    with pytest.raises(KeyError, match="NO_SUCH_VARIABLE"):
        environment_variable("NO_SUCH_VARIABLE")


def test_the_eval_verb_runs_the_self_judged_suite_on_a_checkpoint(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    task_model_dir(tmp_path / "model", max_seq_len=384)
    out = tmp_path / "report"
    flags = ["num_tasks=1", "max_tokens=16", "max_steps=2"]
    code = main(
        ["eval", "--suite", "judge", "--checkpoint", str(tmp_path / "model"), "--out", str(out)]
        + [x for f in flags for x in ("--gin_param", f"eval.Suite.{f}")]
        + ["--gin_param", "eval.JudgeSuite.max_tokens=8"]
    )
    assert code == 0
    result = load_result(out)
    assert result["evaluated"] == str(tmp_path / "model") and result["self_judged"]
    assert len(result["items"]) == 2  # one problem per difficulty
    assert result["judge_prompts"]["pointwise"]["sha256"] == POINTWISE_PROMPT.sha256
    printed = capsys.readouterr().out
    assert "# Evaluation: suite `judge` (LLM-as-judge)" in printed and "Self-judged" in printed
    assert f"{out}/judge.png" in printed
