"""bench/efficiency.py's task-success part: quantised variants of an agent and the float model on
the same held-out problems, their paired differences and intervals, and the pipeline's task."""

import json
import pathlib
import sys

import gin
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import task_model_dir
from tiny_tasks import SHORT

from agentic_jax.models.quantization import quantize_params
from agentic_jax.post_training.evaluate import Evaluation
from agentic_jax.post_training.tasks import TaskSpec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import efficiency as bench


def test_quantised_agents_play_the_float_models_problems(tmp_path, monkeypatch, capsys):
    """A tiny random agent on ``tiny_tasks.SHORT`` (greedy success 0, some sampled successes):
    the variants (here the float model, int8 and a second copy of the float model, in place of
    ``compressed_variants``, which the compression test runs in full) play the same problems
    with the same key, so the float copy reproduces the float model's outcomes exactly."""
    task_model_dir(tmp_path, max_seq_len=SHORT.context_length)
    monkeypatch.setattr(bench, "pipeline_tasks", lambda files, params: SHORT)
    monkeypatch.setattr(
        bench,
        "compressed_variants",
        lambda params, config, calibration, **options: {
            "float": params,
            "int8": quantize_params(params, config, "int8"),
            "float_copy": params,
        },
    )
    out, png = tmp_path / "out", tmp_path / "efficiency.png"
    argv = ["--checkpoint", str(tmp_path), "--out", str(out), "--plot", str(png), "--ppl_len", "32"]
    argv += ["--calibration_rows", "2", "--problems", "4", "--samples", "2", "--eval_rows", "8"]
    results = bench.main(argv)  # no --init_from: task success alone

    assert set(results) == {"setup", "task_success"}
    assert results["task_success"]["setup"]["problems"] == SHORT.num_heldout
    rows = results["task_success"]["rows"]
    assert list(rows) == ["float32", "int8", "float_copy"]
    base = rows["float32"]
    assert sum(base["per_problem_pass@1"]) > 0  # sampled episodes do succeed: a real comparison
    for metric in ("success", "pass@1"):
        assert rows["float_copy"][f"per_problem_{metric}"] == base[f"per_problem_{metric}"]
        assert rows["float_copy"][f"{metric}_delta"] == 0.0
        assert rows["float_copy"][f"{metric}_ci95"] == [0.0, 0.0]
        for r in rows.values():
            values = np.array(r[f"per_problem_{metric}"])
            assert values.shape == (4,) and set(values * 2) <= {0, 1, 2}
            delta = np.mean(values - np.array(base[f"per_problem_{metric}"]))
            assert r[f"{metric}_delta"] == pytest.approx(delta)
            low, high = r[f"{metric}_ci95"]
            assert low - 1e-12 <= r[f"{metric}_delta"] <= high + 1e-12
    report = capsys.readouterr().out
    assert "**Task success**" in report
    for name in rows:
        assert f"| {name} |" in report
    saved = json.loads((out / "results.json").read_text())["task_success"]["rows"]
    assert saved.keys() == rows.keys()
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_part_without_its_model_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path), "--parts", "task_success"])
    assert "--parts task_success needs --checkpoint" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path)])
    assert "give --init_from" in capsys.readouterr().err


def _evaluation(success, sampled_correct, samples) -> Evaluation:
    n = len(success)
    return Evaluation(
        np.asarray(success, bool),
        np.asarray(success, np.float32),
        np.zeros(n, np.int32),
        np.zeros(n, np.int32),
        np.asarray(sampled_correct, np.int32),
        samples,
    )


@settings(max_examples=15, deadline=None)
@given(st.data(), st.integers(2, 12), st.integers(1, 4))
def test_paired_deltas_are_mean_differences_within_their_intervals(data, problems, samples):
    outcomes = st.lists(st.booleans(), min_size=problems, max_size=problems)
    counts = st.lists(st.integers(0, samples), min_size=problems, max_size=problems)
    base = _evaluation(data.draw(outcomes), data.draw(counts), samples)
    other = _evaluation(data.draw(outcomes), data.draw(counts), samples)
    rows = bench.paired_deltas({"float32": base, "same": base, "other": other})
    for name in ("float32", "same"):
        assert rows[name]["success_delta"] == rows[name]["pass@1_delta"] == 0.0
        assert rows[name]["success_ci95"] == rows[name]["pass@1_ci95"] == [0.0, 0.0]
    expected = {
        "success": np.mean(other.success.astype(float) - base.success),
        "pass@1": np.mean((other.sampled_correct - base.sampled_correct) / samples),
    }
    for metric, delta in expected.items():
        assert rows["other"][f"{metric}_delta"] == pytest.approx(delta)
        low, high = rows["other"][f"{metric}_ci95"]
        assert -1 <= low <= delta + 1e-9 and delta - 1e-9 <= high <= 1
    assert rows["other"]["success"] == pytest.approx(np.mean(other.success))


def test_paired_deltas_refuse_evaluations_of_different_problems():
    with pytest.raises(ValueError, match="'short' played 2 problems, the reference 3"):
        bench.paired_deltas(
            {
                "float32": _evaluation([1, 0, 1], [1, 0, 1], 1),
                "short": _evaluation([1, 0], [1, 0], 1),
            }
        )


def test_the_task_is_the_pipeline_configs_rl_stage():
    tasks = bench.pipeline_tasks(["quickstart"], ["rl/TaskSpec.num_heldout = 3"])
    assert tasks.num_heldout == 3 and tasks.first_seed == 100000
    assert [(g.family, g.difficulty) for g in tasks.generators] == [("Arithmetic", 2)]
    with gin.config_scope("rl"):  # the bindings are gone again
        assert TaskSpec().num_heldout == 200
