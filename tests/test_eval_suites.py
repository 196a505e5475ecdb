"""Evaluation suites through the agent harness: episodes, robustness variants, reports, the CLI.

A demonstration-replaying policy is the independent reference: it knows each task's correct
trajectory, so it must succeed on every variant it adapts to, and its tool calls must equal the
golden ones.
"""

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import task_model_dir

from agentic_jax.agents.policies.base import AssistantMessage, Usage
from agentic_jax.cli import main
from agentic_jax.data.chat import ToolCall
from agentic_jax.envs.text import Arithmetic, Lookup
from agentic_jax.envs.text.tools import Calculator
from agentic_jax.eval.agent_metrics import (
    Episode,
    call_key,
    check_comparable,
    reliability,
    summarize,
    tool_call_precision_recall,
    trajectory_efficiency,
)
from agentic_jax.eval.metrics import pass_at_k
from agentic_jax.eval.suites import robustness
from agentic_jax.eval.suites.episodes import play, task_id, verifier_id
from agentic_jax.eval.suites.report import build_result, compare, load_result, write_report
from agentic_jax.eval.suites.suite import Suite, run_suite
from agentic_jax.eval.suites.training_data import TrainingData


def _perturb(arguments):
    """The same arguments with a space added to every string (a different call, same meaning
    for the calculator)."""
    if isinstance(arguments, dict):
        return {k: _perturb(v) for k, v in arguments.items()}
    return arguments + " " if isinstance(arguments, str) else arguments


class DemoPolicy:
    """Plays each task's demonstration, its calls adapted to ``variant``; after a failed call
    it retries that call once, perturbed (``adapt=False``: the original calls, unchanged)."""

    def __init__(self, tasks, variant=robustness.Variant(), tools=(Calculator(),), adapt=True):
        self.by_question = {t.prompt[-1].content: t for t in tasks}
        self.variant, self.tools, self.adapt = variant, tools, adapt
        self.calls = 0

    def respond(self, messages, tools=(), **sampling):
        self.calls += 1
        task = self.by_question[messages[1].content]
        turns = [m for m in task.demonstration if m.role == "assistant"]
        results = [m for m in messages if m.role == "tool"]
        done = sum(not m.content.startswith("error") for m in results)
        if not self.adapt:
            done = len(results)
        if self.adapt and results and results[-1].content.startswith("error"):
            last = next(m for m in reversed(messages) if m.role == "assistant")
            call = last.tool_calls[0]
            return AssistantMessage(
                "", (ToolCall(call.name, _perturb(call.arguments)),), Usage(10, 5), "tool_calls"
            )
        turn = turns[done]
        calls = tuple(
            self.variant.adapt(c, self.tools) if self.adapt else c for c in turn.tool_calls
        )
        return AssistantMessage(
            turn.content, calls, Usage(10, 5), "tool_calls" if calls else "stop"
        )


TASKS = Arithmetic(2).tasks(range(1_000_000, 1_000_004))


@pytest.mark.parametrize("name", sorted(robustness.VARIANTS))
def test_a_policy_that_adapts_solves_every_variant(name):
    variant = robustness.variant(name)
    reward = Arithmetic(2).reward
    for task in TASKS:
        policy = DemoPolicy([task], variant)
        episode = play(policy, task, (Calculator(),), reward, variant=variant)
        assert episode.success and episode.error is None, (name, episode)
        golden = episode.golden_calls
        if name == "injected_errors":  # one failed call, then the perturbed retry, then the rest
            assert episode.tool_statuses[0] == "error_result"
            assert all(s == "ok" for s in episode.tool_statuses[1:])
            assert episode.tool_calls[0] == golden[0] and episode.tool_calls[2:] == golden[1:]
        else:
            assert episode.tool_calls == golden
            assert set(episode.tool_statuses) == {"ok"}


@pytest.mark.parametrize(
    "name, broken",
    [
        ("renamed", "unknown_tool"),
        ("nested_schema", "invalid_arguments"),
        ("command_line", "unknown_tool"),
    ],
)
def test_variants_that_change_the_interface_reject_the_original_calls(name, broken):
    variant = robustness.variant(name)
    task = TASKS[0]
    episode = play(
        DemoPolicy([task], adapt=False),
        task,
        (Calculator(),),
        Arithmetic(2).reward,
        variant=variant,
    )
    assert episode.tool_statuses and set(episode.tool_statuses) == {broken}
    original = play(DemoPolicy([task], adapt=False), task, (Calculator(),), Arithmetic(2).reward)
    assert set(original.tool_statuses) == {"ok"}


def test_each_variant_changes_what_it_says_and_nothing_else():
    tools = (Calculator(), Lookup())
    specs = [t.spec for t in tools]
    renamed = [t.spec for t in robustness.variant("renamed").tools(tools)]
    assert {s.name for s in renamed}.isdisjoint({s.name for s in specs})
    assert [s.description for s in renamed] == [s.description for s in specs]
    nested = [t.spec for t in robustness.variant("nested_schema").tools(tools)]
    assert [s.name for s in nested] == [s.name for s in specs]
    assert [s.parameters["properties"]["request"] for s in nested] == [s.parameters for s in specs]
    para = [t.spec for t in robustness.variant("paraphrased").tools(tools)]
    assert [(s.name, s.parameters) for s in para] == [(s.name, s.parameters) for s in specs[::-1]]
    assert all(p.description != s.description for p, s in zip(para, specs[::-1]))
    task = TASKS[0]
    expression = task.demonstration[0].tool_calls[0].arguments["expression"]
    plain = Calculator().run_host(expression, task)
    [noisy] = robustness.variant("noisy_outputs").tools([Calculator()])
    assert noisy.run_host(expression, task) == plain + robustness.NOISE
    [failing] = robustness.variant("injected_errors").tools([Calculator()])
    assert [failing.run_host(expression, task) for _ in range(2)] == [robustness.TRANSIENT, plain]
    [shell] = robustness.variant("command_line").tools(tools)
    assert shell.spec.name == "shell" and "calculator --expression" in shell.spec.description
    assert (
        shell.run_host(
            shell.host_argument({"command": f"calculator --expression '{expression}'"}), task
        )
        == plain
    )
    assert shell.host_argument({"command": "calculator --bad 1"}) is None


def _episode(task_id="t", success=True, **fields):
    return Episode(task_id, "h", "v", 0, 0, success, **fields)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from("abcd"), max_size=8), st.lists(st.sampled_from("abcd"), max_size=8))
def test_tool_call_precision_and_recall_count_a_multiset_overlap(calls, golden):
    precision, recall = tool_call_precision_recall(calls, golden)
    remaining, hits = list(golden), 0
    for c in calls:  # the slow reference: match each call against a golden copy left
        if c in remaining:
            remaining.remove(c)
            hits += 1
    assert precision == (hits / len(calls) if calls else float(not golden))
    assert recall == (hits / len(golden) if golden else float(not calls))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=6))
def test_reliability_is_pass_at_k_and_pass_hat_k_over_tasks(outcomes):
    episodes = [_episode(f"t{i}", s) for i, trials in enumerate(outcomes) for s in trials]
    got = reliability(episodes, (1, 3))
    c = np.array([sum(t) for t in outcomes])
    assert got["pass@3"] == pytest.approx(np.mean(pass_at_k(3, c, 3)))
    assert got["pass^3"] == pytest.approx(np.mean(c == 3))  # all three trials succeeded
    assert got["pass^1"] == pytest.approx(got["pass@1"]) == pytest.approx(c.mean() / 3)


def test_summary_counts_errors_recovery_and_efficiency():
    episodes = [
        _episode("a", True, steps=2, tool_calls=("x", "y"), tool_statuses=("error_result", "ok")),
        _episode("b", False, steps=4, tool_calls=("x",), tool_statuses=("invalid_arguments",)),
        _episode("c", False, error="PolicyError: boom"),
    ]
    s = summarize(episodes, max_steps=4)
    assert s["success"] == pytest.approx(1 / 3) and s["errored"] == 1
    assert s["invalid_call_rate"] == pytest.approx(2 / 3)
    assert s["recovery_rate"] == pytest.approx(0.5)  # a recovered, b did not
    assert s["efficiency"] == pytest.approx(np.mean([0.5, 0.0, 1.0]))
    assert trajectory_efficiency(9, 4) == 0.0
    with pytest.raises(ValueError, match="max_steps"):
        trajectory_efficiency(1, 0)


def test_runs_compare_only_on_the_same_tasks_states_and_verifiers():
    a = [_episode("t1"), _episode("t2")]
    check_comparable(a, [_episode("t1", False), _episode("t2")])
    with pytest.raises(ValueError, match="different tasks"):
        check_comparable(a, [_episode("t1")])
    with pytest.raises(ValueError, match="initial state or verifier"):
        check_comparable(a, [_episode("t1"), dataclasses.replace(_episode("t2"), state_hash="x")])
    assert verifier_id(Arithmetic(2).reward) == verifier_id(Arithmetic(2).reward)
    assert verifier_id(Arithmetic(2).reward) != verifier_id(
        Arithmetic(2, partial_credit=False).reward
    )
    assert call_key("f", {"b": 1, "a": 2}) == 'f({"a": 2, "b": 1})'


SUITE = dict(
    name="t",
    generators=(Arithmetic(1), Arithmetic(2)),
    num_tasks=3,
    seeds=(0, 1),
    ks=(1, 2),
    variants=("original", "renamed", "injected_errors"),
)


def test_a_suite_reports_resumes_and_refuses_mismatched_comparisons(tmp_path):
    suite = Suite(**SUITE)
    tasks = [t for t, _, _ in suite.problems()]

    class PerVariant:  # the demonstration, adapted to whichever tool names the prompt offers
        calls = 0

        def respond(self, messages, tools=(), **sampling):
            PerVariant.calls += 1
            names = {getattr(t, "name", None) for t in tools}
            variant = robustness.variant("renamed" if "compute" in names else "original")
            return DemoPolicy(tasks, variant).respond(messages, tools, **sampling)

    episodes = run_suite(suite, PerVariant(), tmp_path, progress=False)
    assert {n: len(e) for n, e in episodes.items()} == dict.fromkeys(suite.variants, 12)
    assert all(e.success for eps in episodes.values() for e in eps)
    # A tiny pretraining corpus into which the first problem was copied.
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"Quiz: {tasks[0].prompt[-1].content} Answers below.")
    result = build_result(suite, episodes, "demo", TrainingData(corpus=[str(corpus)]))
    paths = write_report(result, tmp_path)
    assert [p.name for p in paths if p.exists()] == [
        "results.json",
        "report.md",
        "success.png",
        "reliability.png",
    ]
    assert paths[2].read_bytes()[:8] == paths[3].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = paths[1].read_text()
    assert "## Robustness" in report and "injected_errors" in report
    assert "## Contamination" in report and f"`{task_id(tasks[0])}`" in report
    assert "## Calibration" in report
    loaded = load_result(tmp_path)
    flagged = {t for t, v in loaded["contamination"]["items"].items() if v["flagged"]}
    assert flagged == {task_id(tasks[0])} and loaded["contamination"]["fraction_flagged"] == 1 / 6
    assert loaded["contamination"]["variants"]["original"] == dict.fromkeys(
        ("success", "clean", "flagged"), 1.0
    )
    # Both trials of every task agree and are right: confidence 1, accuracy 1, ECE 0.
    calibration = loaded["calibration"]["original"]
    assert (calibration["trials"], calibration["ece"], calibration["confidence"]) == (2, 0.0, 1.0)
    assert loaded["hashes"]["original"] != loaded["hashes"]["renamed"]
    assert loaded["variants"]["renamed"]["difference_vs_original"] == [0.0, 0.0, 0.0]
    assert loaded["variants"]["original"]["summary"]["pass^2"] == 1.0
    assert {e["seed"] for e in loaded["episodes"]["original"]} == {0, 1000}
    # Resuming replays nothing.
    before = PerVariant.calls
    run_suite(suite, PerVariant(), tmp_path, progress=False)
    assert PerVariant.calls == before
    assert compare(loaded, loaded)["original"] == (0.0, 0.0, 0.0)
    other = json.loads(json.dumps(loaded))
    other["seeds"] = [0, 2]
    with pytest.raises(ValueError, match="seeds"):
        compare(loaded, other)


def test_suite_settings_are_checked():
    with pytest.raises(ValueError, match="unknown robustness variant"):
        Suite(variants=("original", "upside_down"))
    with pytest.raises(ValueError, match="must start with 'original'"):
        Suite(variants=("renamed",))
    with pytest.raises(ValueError, match="trials"):
        Suite(ks=(5,))


def test_the_eval_verb_writes_the_report_of_a_checkpoint(tmp_path, capsys):
    (tmp_path / "model").mkdir()
    task_model_dir(tmp_path / "model", max_seq_len=384)
    out = tmp_path / "report"
    code = main(
        [
            "eval",
            "--suite",
            "arithmetic",
            "--checkpoint",
            str(tmp_path / "model"),
            "--out",
            str(out),
            "--gin_param",
            "eval.Suite.num_tasks=1",
            "--gin_param",
            "eval.Suite.seeds=[0]",
            "--gin_param",
            "eval.Suite.ks=[1]",
            "--gin_param",
            "eval.Suite.max_steps=2",
            "--gin_param",
            "eval.Suite.max_tokens=16",
        ]
    )
    assert code == 0
    assert {"results.json", "report.md", "success.png", "episodes.jsonl"} <= {
        p.name for p in out.iterdir()
    }
    result = load_result(out)
    assert result["evaluated"] == str(tmp_path / "model")
    assert result["variants"]["original"]["summary"]["episodes"] == 3  # one task per difficulty
    # The shipped training data: the held-out one-operator problem repeats an SFT problem.
    sources = {t: v["sources"] for t, v in result["contamination"]["items"].items()}
    assert sources == {
        "Arithmetic/d1/s1000000": ["SFT demonstrations"],
        "Arithmetic/d2/s1000000": [],
        "Arithmetic/d3/s1000000": [],
    }
    assert result["calibration"]["original"] == {
        "trials": 1,
        "needs": "at least 2 trials per task (seeds x trials)",
    }
    printed = capsys.readouterr().out
    assert "# Evaluation: suite `arithmetic`" in printed
    assert "calibration needs at least 2 trials" in printed
