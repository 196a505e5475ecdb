"""bench/test_time_scaling.py at a tiny size: every method at every level, compute counted, and
the verifier's choice an upper bound on every selection from the same samples."""

import json
import pathlib
import sys

import jax.numpy as jnp
import numpy as np
from tiny_models import task_model_dir

from agentic_jax.post_training.reward import save_reward_head

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import test_time_scaling as bench

TINY = [
    "rl/TaskSpec.generators = [@one/agentic_jax.envs.text.Arithmetic()]",
    "rl/TaskSpec.num_heldout = 2",
    "rl/TaskSpec.max_length = 192",
    "rl/TaskSpec.action_length = 24",
]


def test_every_method_runs_at_every_level_and_the_oracle_bounds_selection(tmp_path):
    policy, rm = tmp_path / "policy", tmp_path / "rm"
    for path in (policy, rm):
        path.mkdir()
    config, _, _ = task_model_dir(policy, max_seq_len=256)
    task_model_dir(rm, max_seq_len=256, seed=1)
    head = {"w": jnp.linspace(-1, 1, config.d_model), "b": jnp.zeros(())}
    save_reward_head(rm, head, kind="process", max_steps=4)
    out = tmp_path / "out"
    argv = ["--model", str(policy), "--reward_model", str(rm), "--out", str(out)]
    argv += ["--levels", "1", "2", *(a for p in TINY for a in ("--gin_param", p))]
    results = bench.main(argv)
    assert set(results) == set(bench.METHODS)
    assert set(results["greedy"]) == {1}
    for name in bench.METHODS[1:]:
        assert set(results[name]) == {1, 2}
        for row in results[name].values():
            assert len(row["success"]) == 2 and row["tokens"] > 0 and row["flops"] > 0
    for n in (1, 2):
        oracle = np.array(results["BoN-oracle"][n]["success"])
        for name in bench.SAMPLING:  # chosen from the same first n samples
            assert np.all(np.array(results[name][n]["success"]) <= oracle)
            assert results[name][n]["tokens"] == results["BoN-oracle"][n]["tokens"]
        assert results["BoN-PRM"][n]["flops"] > results["self-consistency"][n]["flops"]
    assert np.all(
        np.array(results["BoN-oracle"][2]["success"]) >= results["BoN-oracle"][1]["success"]
    )
    assert results["BoN-oracle"][2]["tokens"] > results["BoN-oracle"][1]["tokens"]
    report = (out / "report.md").read_text()
    assert all(f"| {name} |" in report for name in bench.METHODS)
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "results.json").read_text())["problems"] == 2
    # One search rerun alone: the other rows are kept as they were.
    again = bench.main([*argv, "--searches", "ToT-DFS"])
    assert again["BoN-PRM"] == results["BoN-PRM"] and again["ToT-DFS"] == results["ToT-DFS"]
