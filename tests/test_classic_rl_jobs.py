"""The multi-agent jobs through ``agentic-jax train``: each shipped config runs (at a tiny budget)
and leaves metrics.jsonl, report.json and the parsed and operative configs in the work
directory; the report agrees with the metrics."""

import json

import numpy as np
import pytest

from agentic_jax.classic_rl.coma import COMAConfig
from agentic_jax.classic_rl.jobs import trainer_name
from agentic_jax.classic_rl.marl import MARLConfig
from agentic_jax.cli import main
from agentic_jax.training.metrics import read_metrics


def train(config: str, workdir, *params: str) -> tuple[list[dict], dict]:
    argv = ["train", "--gin_file", config, "--workdir", str(workdir)]
    assert main(argv + [arg for p in params for arg in ("--gin_param", p)]) == 0
    assert {"config.gin", "operative_config.gin", "metrics.jsonl", "report.json"} <= {
        p.name for p in workdir.iterdir()
    }
    report = json.loads((workdir / "report.json").read_text())
    return read_metrics(str(workdir / "metrics.jsonl")), report


def test_marl_matrix_trains_coma_and_reports_the_learned_strategies(tmp_path, capsys):
    records, report = train("marl_matrix", tmp_path / "coma", "COMAConfig.num_iterations = 20")
    assert report["trainer"] == "coma" and report["iterations"] == 20 == len(records)
    assert report["env_steps"] == 20 * 64 * 2
    assert [r["step"] for r in records] == list(range(1, 21))
    assert all(len(r["episode_return"]) == 2 and "critic_loss" in r for r in records)
    np.testing.assert_allclose(
        report["final_return"], np.mean([r["return_mean"] for r in records[-2:]]), rtol=1e-6
    )
    policies = np.asarray(report["policies"])
    assert policies.shape == (2, 3) and np.allclose(policies.sum(1), 1.0)
    assert report["nash_conv"] >= -1e-9
    operative = (tmp_path / "coma" / "operative_config.gin").read_text()
    assert "COMAConfig.num_iterations = 20" in operative
    assert f"final_return={report['final_return']:.4g}" in capsys.readouterr().out


def test_marl_signalling_runs_ippo_when_the_critic_is_independent(tmp_path):
    records, report = train(
        "marl_signalling",
        tmp_path,
        "MARLConfig.num_iterations = 5",
        "MARLConfig.critic = 'independent'",
    )
    assert report["trainer"] == "ippo" and len(records) == 5
    assert "nash_conv" not in report and 0.0 <= report["final_return"] <= 1.0


def test_trainers_are_named_by_their_config():
    assert trainer_name(MARLConfig(critic="independent")) == "ippo"
    assert trainer_name(MARLConfig(critic="centralised")) == "mappo"
    assert trainer_name(COMAConfig()) == "coma"


def test_self_play_pgx_reports_win_rates_per_generation(tmp_path):
    pytest.importorskip("pgx")
    records, report = train(
        "self_play_pgx",
        tmp_path,
        "BoardSelfPlayConfig.generations = 2",
        "BoardSelfPlayConfig.iterations = 3",
        "BoardSelfPlayConfig.eval_games = 32",
    )
    assert [r["generation"] for r in records] == [1, 2]
    assert report["training_games"] == 2 * 3 * 64 and report["game"] == "Pgx[tic_tac_toe]()"
    for who in ("vs_random", "vs_first"):
        rates = [report[f"{who}_{r}"] for r in ("win", "draw", "loss")]
        assert (
            sum(rates) == pytest.approx(1.0) and report[f"{who}_win"] == records[-1][f"{who}_win"]
        )


def test_a_trainer_that_is_not_a_marl_config_is_refused(tmp_path):
    with pytest.raises(ValueError, match="MARLConfig or a COMAConfig"):
        main(
            ["train", "--gin_file", "marl_matrix", "--workdir", str(tmp_path)]
            + ["--gin_param", "train_marl.trainer = @BoardSelfPlayConfig()"]
        )
