"""SFT and RFT killed with SIGKILL in the middle of a run (not between runs) and started again
write exactly the metrics of an uninterrupted run (RL: test_post_training_agentic_rl; the whole
pipeline killed mid-RL: test_post_training_pipeline)."""

import sys
import textwrap

import pytest
from killed_runs import kill_when_exists, run_to_end
from tiny_models import task_model_dir

from agentic_jax.training.metrics import read_metrics

TIMING = ("generation_seconds", "training_seconds", "tokens_per_sec", "step_seconds")

STAGES = {
    "sft": """
        from agentic_jax.post_training.sft import train_sft
        train_sft(workdir, init_from=base, tasks=SHORT, steps=30, batch_size=4, peak_lr=1e-2,
                  eval_every=20, checkpoint_every=10, progress=False)
    """,
    "rft": """
        from agentic_jax.post_training.rft import train_rft
        train_rft(workdir, init_from=base, tasks=SHORT, rounds=3, prompts_per_round=4,
                  samples_per_prompt=2, steps_per_round=2, batch_size=2, peak_lr=1e-2,
                  progress=False)
    """,
}
# The checkpoint after which each run is killed: SFT at step 10 of 30, RFT after round 2 of 3.
KILL_AFTER = {"sft": 10, "rft": 4}


def _untimed(path):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(path)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    task_model_dir(path, max_seq_len=128)
    return path


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_killed_mid_run_resumes_with_identical_metrics(base, tmp_path, stage):
    script = tmp_path / "run.py"
    script.write_text(
        "import sys\nfrom tiny_tasks import SHORT\nworkdir, base = sys.argv[1:3]\n"
        + textwrap.dedent(STAGES[stage])
    )

    def cmd(name):
        return [sys.executable, str(script), str(tmp_path / name), str(base)]

    run_to_end(cmd("whole"))
    kill_when_exists(cmd("killed"), tmp_path / "killed" / "checkpoints" / str(KILL_AFTER[stage]))
    run_to_end(cmd("killed"))
    whole = _untimed(tmp_path / "whole" / "metrics.jsonl")
    assert _untimed(tmp_path / "killed" / "metrics.jsonl") == whole and len(whole) > 2
