"""bench/agentic_rl.py at a tiny size: every method and seed spends the one budget, and the report
states it (not whether RL helps: that is the study's to measure)."""

import json
import pathlib
import sys

import gin
import pytest
from tiny_models import task_model_dir

from agentic_jax import config as gin_config
from agentic_jax.post_training.rl import RLConfig

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import agentic_rl
from bench.post_training import RL_CONFIGS

TINY = [
    "rl/TaskSpec.generators = [@one/agentic_jax.envs.text.Arithmetic()]",
    "rl/TaskSpec.num_train = 8",
    "rl/TaskSpec.num_heldout = 3",
    "rl/TaskSpec.max_length = 192",
    "rl/TaskSpec.action_length = 24",
    "train_rl.progress = False",
]


def test_the_study_counts_one_budget_for_every_method_and_seed(tmp_path, monkeypatch, capsys):
    sft = tmp_path / "sft"
    sft.mkdir()
    task_model_dir(sft, max_seq_len=256)
    out = tmp_path / "study"
    argv = ["agentic_rl", "--sft", str(sft), "--out", str(out), "--steps", "1", "--samples", "2"]
    argv += ["--seeds", "0", "1", "--methods", "sft", "dapo"]
    for binding in TINY:
        argv += ["--gin_param", binding]
    monkeypatch.setattr(sys, "argv", argv)
    agentic_rl.main()
    report = capsys.readouterr().out

    results = json.loads((out / "results.json").read_text())
    assert list(results["sft"]["seeds"]) == ["0"]  # one model, one evaluation
    runs = results["dapo"]["seeds"]
    assert sorted(runs) == ["0", "1"]
    # The budget is 1 x 64 episodes with every sampling round counted, dynamic sampling's too.
    assert all(r["episodes"] == 64 for r in runs.values())
    assert all(len(r["pass@1"]) == len(r["greedy"]) == 3 for r in runs.values())
    assert (out / "curves" / "dapo.png").stat().st_size > 0
    row = next(line for line in report.splitlines() if line.startswith("| dapo |"))
    assert "| 64 |" in row and "[" in row.split("|")[3]  # episodes, and a CI vs SFT
    assert (out / "curves" / "comparison.png").stat().st_size > 0
    assert "Budget: 64 episodes per method and seed" in report
    assert (out / "report.md").read_text().strip() in report

    # A rerun finds every run done and trains nothing.
    mtime = (out / "results.json").stat().st_mtime_ns
    agentic_rl.main()
    assert (out / "results.json").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("study", ["agentic_rl_study", "agentic_rl_study_large"])
def test_every_rl_method_of_the_study_trains_with_the_main_jobs_rl_optimiser(study):
    """The study measures methods at the RL setting the main job ships (rate and KL penalty), not
    at rl_common.gin's gentler default, which its method configs inherit."""

    def setting(files: list[str]) -> tuple[float, float]:
        gin_config.parse(files, [])
        return gin.query_parameter("train_rl.peak_lr"), RLConfig().kl_coef

    try:
        main_job = setting(["quickstart"])
        assert setting(["rl_common"]) != main_job  # else this test checks nothing
        for method_config in RL_CONFIGS.values():
            assert setting([method_config, study]) == main_job, method_config
    finally:
        gin.clear_config()
