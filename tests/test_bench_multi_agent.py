"""bench/multi_agent.py at a tiny size: every method gets the same counted budget, every router
sees the same requests, the regret columns are what ``cumulative_regret`` says, and the
self-play rates are per generation and sum to one."""

import json
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import multi_agent as bench


def test_one_budget_per_method_and_pseudo_regret_on_the_same_requests(tmp_path, capsys):
    out, png = tmp_path / "out", tmp_path / "multi_agent.png"
    argv = ["--out", str(out), "--plot", str(png), "--games", "prisoners_dilemma"]
    argv += ["--iterations", "6", "--envs", "8", "--steps", "2", "--seeds", "2"]
    argv += ["--trainers", "centralised", "coma"]
    argv += ["--requests", "400", "--generations", "2", "--self_play_iterations", "2"]
    argv += ["--eval_games", "16"]
    results = bench.main(argv)

    marl = results["marl"]
    assert [(r["game"], r["trainer"]) for r in marl.values()] == [
        ("prisoners_dilemma", "centralised"),
        ("prisoners_dilemma", "coma"),
    ]
    for r in marl.values():
        assert r["env_steps_per_seed"] == 6 * 8 * 2
        assert np.asarray(r["curves"]).shape == (2, 6) and len(r["nash_conv"]) == 2
        assert all(gap >= -1e-9 for gap in r["nash_conv"])
        assert "optimum_reached" not in r  # the prisoner's dilemma pays the players apart

    sp = results["self_play"]
    assert sp["training_games_per_seed"] == 2 * 2 * 64
    for who in ("vs_random", "vs_first"):
        rates = np.array([sp[f"{who}_{r}"] for r in ("win", "draw", "loss")])  # [3, generations]
        assert rates.shape == (3, 2) and np.allclose(rates.sum(0), 1.0)
    assert "team" not in results  # no --sft: no text-task comparison

    routers = results["router"]
    assert list(routers) == ["linucb", "thompson", "uniform random", "best fixed arm"]
    for r in routers.values():
        curve = np.asarray(r["curve"])
        assert r["requests"] == 400 == len(curve)
        assert np.all(np.diff(curve) >= -1e-4)  # grows (float32 sums round)
        assert r["regret_per_request_best"] == curve[-1] >= r["regret_best_fixed"] - 1e-4
    assert routers["best fixed arm"]["regret_best_fixed"] == 0.0
    # a learned router beats guessing on the same requests
    assert (
        routers["linucb"]["regret_per_request_best"]
        < routers["uniform random"]["regret_per_request_best"]
    )

    report = capsys.readouterr().out
    for name in routers:
        assert f"| {name} |" in report
    assert json.loads((out / "results.json").read_text())["router"].keys() == routers.keys()
    assert "| prisoners_dilemma | coma | 96 |" in report and "| 2 | " in report
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
