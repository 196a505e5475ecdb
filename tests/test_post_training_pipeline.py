"""`agentic-jax train` with the quickstart config: tokenizer -> pretraining -> SFT -> RL -> report,
and its exact resumption after a SIGKILL in the middle of RL."""

import json
import shutil
import sys

import gin
import pytest
from killed_runs import kill_when_exists
from tiny_tasks import TINY_PIPELINE

from agentic_jax import config as gin_config
from agentic_jax.cli import main
from agentic_jax.config import config_dir
from agentic_jax.post_training.pipeline import evaluate_run
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.metrics import read_metrics

RL_STEPS = 4
PARAMS = [*TINY_PIPELINE, f"train_rl.steps = {RL_STEPS}", "train_rl.checkpoint_every = 2"]
TIMING = ("generation_seconds", "training_seconds")
_AFTER_SFT = {"rl", "report.json", "report.png"}


def _args(workdir):
    return ["train", "--workdir", str(workdir), *(a for p in PARAMS for a in ("--gin_param", p))]


def _outputs(workdir):
    """The report and the RL stage's metrics, without wall-clock."""
    records = read_metrics(workdir / "rl" / "metrics.jsonl")
    untimed = [{k: v for k, v in r.items() if k not in TIMING} for r in records]
    return json.loads((workdir / "report.json").read_text()), untimed


def test_quickstart_pipeline_writes_every_stage_and_the_report_and_survives_sigkill(tmp_path):
    workdir = tmp_path / "run"
    assert main(_args(workdir)) == 0  # no --gin_file: the built-in quickstart pipeline
    for stage in ("pretrain", "sft", "rl"):
        assert (workdir / stage / "model" / "config.json").exists()
    steps = list(range(1, RL_STEPS + 1))
    assert [r["step"] for r in read_metrics(workdir / "rl" / "metrics.jsonl")] == steps
    report = json.loads((workdir / "report.json").read_text())
    for when in ("before_rl", "after_rl"):  # held-out rl_tasks: one generator x 2 problems
        result = report[when]
        assert len(result["per_task_success"]) == 2
        assert (
            0.0 <= result["success"] <= 1.0 and 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0
        )
        assert result["tool_calls"] >= 0
    for measure in ("success", "pass@1"):
        low, high = report["improvement"][f"{measure}_ci95"]
        assert low <= report["improvement"][f"{measure}_difference"] <= high
    slices = report["by_slice"]  # the RL slice's generators, each its own row
    assert list(slices) == ["Arithmetic/2"] and slices["Arithmetic/2"]["problems"] == 2
    for model, when in (("sft", "before_rl"), ("rl", "after_rl")):
        weighted = sum(row["problems"] * row[f"success_{model}"] for row in slices.values())
        assert weighted / 2 == pytest.approx(report[when]["success"])
    assert {"reward_mean", "success_rate", "response_length"} <= report["rl_curves"][-1].keys()
    # Retention: both models on SFT's held-out problems too, by slice, the paired difference in
    # its interval.
    kept = report["retention"]
    low, high = kept["success_ci95"]
    assert low <= kept["success_difference"] <= high
    assert kept["success_difference"] == pytest.approx(kept["success_rl"] - kept["success_sft"])
    problems = sum(row["problems"] for row in kept["by_slice"].values())
    for model in ("sft", "rl"):
        weighted = sum(
            row["problems"] * row[f"success_{model}"] for row in kept["by_slice"].values()
        )
        assert weighted / problems == pytest.approx(kept[f"success_{model}"])
    assert (workdir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Running the command again finds every stage done and only re-evaluates.
    assert main(_args(workdir)) == 0
    assert [r["step"] for r in read_metrics(workdir / "rl" / "metrics.jsonl")] == steps
    # Killed in the middle of RL (during step 3) and run again, it ends as the run above did.  The
    # stages before RL are deterministic and already tested above, so the killed run starts from
    # a copy of them.
    killed = tmp_path / "killed"
    shutil.copytree(workdir, killed, ignore=lambda d, names: _AFTER_SFT & set(names))
    cli = [sys.executable, "-m", "agentic_jax.cli", *_args(killed)]
    kill_when_exists(cli, killed / "rl" / "checkpoints" / "2")
    assert main(_args(killed)) == 0
    assert _outputs(killed) == _outputs(workdir)
    # A kept evaluation is reused only for the same problems, samples and seed.
    with gin.config_scope("rl"):
        spec = TaskSpec()
    kept = json.loads((workdir / "sft" / "heldout_eval.json").read_text())
    assert evaluate_run(str(workdir / "sft"), spec, 2, 0) == kept
    assert evaluate_run(str(workdir / "sft"), spec, 1, 0)["samples"] == 1


@pytest.mark.parametrize("name", sorted(p.stem for p in config_dir().glob("*.gin")))
def test_every_shipped_config_parses(name):
    import agentic_jax.registry  # noqa: F401  (registers every configurable)

    gin_config.parse([name], [])


def test_importing_every_configurable_leaves_the_jax_backend_alone():
    """Multi-process jobs call jax.distributed.initialize after the CLI imported the registry."""
    import subprocess
    import sys

    code = (
        "import jax._src.xla_bridge as xb, agentic_jax.registry; "
        "assert not xb.backends_are_initialized(), 'an import initialised the JAX backend'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
