"""`agentic-jax train` with the quickstart config: tokenizer -> pretraining -> SFT -> RL -> report."""

import json
import os

import pytest

from agentic_jax import config as gin_config
from agentic_jax.cli import main
from agentic_jax.config import config_dir
from agentic_jax.training.metrics import read_metrics

HERE = os.path.dirname(__file__)
CORPUS = os.path.join(HERE, "data", "tiny_corpus.txt")

# The quickstart pipeline at toy sizes: every stage runs, in seconds.
TINY = [
    f"post_training.tokenizer_corpus = ['{CORPUS}']",
    f"train_data.files = ['{CORPUS}']",
    f"heldout_data.files = ['{CORPUS}']",
    "post_training.vocab_size = 500",
    "post_training.eval_samples = 2",
    "TransformerConfig.d_model = 32",
    "TransformerConfig.n_layers = 1",
    "TransformerConfig.n_heads = 2",
    "TransformerConfig.n_kv_heads = 1",
    "TransformerConfig.head_dim = 16",
    "TransformerConfig.d_ff = 64",
    "train.steps = 4",
    "train.batch_size = 8",
    "train.seq_len = 32",
    "train.eval_every = 4",
    "train.checkpoint_every = 4",
    "make_schedule.warmup_steps = 1",
    "train_sft.steps = 3",
    "train_sft.batch_size = 4",
    "train_sft.eval_every = 3",
    "train_rl.steps = 2",
    "RLConfig.group_size = 2",
    "RLConfig.prompts_per_step = 2",
    "sft/TaskSpec.num_train = 8",
    "sft/TaskSpec.num_heldout = 3",
    "rl/TaskSpec.num_train = 8",
    "rl/TaskSpec.num_heldout = 2",
]


def test_quickstart_pipeline_writes_every_stage_and_the_report(tmp_path):
    workdir = tmp_path / "run"
    args = ["train", "--workdir", str(workdir), *(a for p in TINY for a in ("--gin_param", p))]
    assert main(args) == 0  # no --gin_file: the built-in quickstart pipeline
    for stage in ("pretrain", "sft", "rl"):
        assert (workdir / stage / "model" / "config.json").exists()
    assert [r["step"] for r in read_metrics(workdir / "rl" / "metrics.jsonl")] == [1, 2]
    report = json.loads((workdir / "report.json").read_text())
    for when in ("before_rl", "after_rl"):  # held-out rl_tasks: two generators x 2 problems
        result = report[when]
        assert len(result["per_task_success"]) == 4
        assert (
            0.0 <= result["success"] <= 1.0 and 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0
        )
        assert result["tool_calls"] >= 0
    for measure in ("success", "pass@1"):
        low, high = report["improvement"][f"{measure}_ci95"]
        assert low <= report["improvement"][f"{measure}_difference"] <= high
    assert {"reward_mean", "success_rate", "response_length"} <= report["rl_curves"][-1].keys()
    assert (workdir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Running the command again finds every stage done and only re-evaluates.
    assert main(args) == 0
    assert [r["step"] for r in read_metrics(workdir / "rl" / "metrics.jsonl")] == [1, 2]


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
