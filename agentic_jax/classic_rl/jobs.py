"""The multi-agent trainers as jobs of ``agentic-jax train`` (``run_job.job = @train_marl`` or
``@train_board_self_play``; configs/marl_matrix.gin, marl_signalling.gin, self_play_pgx.gin).

Each job writes to its work directory::

    config.gin, operative_config.gin   the gin config as parsed and as used
    metrics.jsonl                      one record per iteration (per generation for self-play)
    report.json                        the run in brief: what was trained, its budget, the result

and returns the report's numbers as floats (what ``agentic-jax train`` prints).  The games are
gin-configurable here (``@MatrixGame()``, ``@SignallingGame()``, ``@PgxEnv()``) because
``agentic_jax.envs`` keeps clear of gin.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import gin
import jax
import numpy as np

from agentic_jax import config as gin_config
from agentic_jax.classic_rl.board_self_play import BoardSelfPlayConfig, make_board_self_play
from agentic_jax.classic_rl.coma import COMAConfig, make_coma
from agentic_jax.classic_rl.marl import MARLConfig, make_marl, policy_logits
from agentic_jax.envs import MatrixGame, PgxEnv, SignallingGame
from agentic_jax.envs.markov_game import MarkovGame
from agentic_jax.files import atomic_write, write_json

gin.external_configurable(MatrixGame, module="agentic_jax.envs")
gin.external_configurable(SignallingGame, module="agentic_jax.envs")
gin.external_configurable(PgxEnv, module="agentic_jax.envs")


def trainer_name(trainer: MARLConfig | COMAConfig) -> str:
    """ "coma", or "ippo" / "mappo" for a PPO config's independent / centralised critic."""
    if isinstance(trainer, COMAConfig):
        return "coma"
    if isinstance(trainer, MARLConfig):
        return "ippo" if trainer.critic == "independent" else "mappo"
    raise ValueError(f"train_marl.trainer must be a MARLConfig or a COMAConfig, got {trainer!r}")


def write_run(workdir: str, records: list[dict], report: dict) -> dict:
    """``metrics.jsonl``, ``report.json`` (atomically) and the operative config; returns the
    report's numbers as floats."""
    with atomic_write(Path(workdir) / "metrics.jsonl", encoding="utf-8") as sink:
        sink.writelines(json.dumps(r) + "\n" for r in records)
    write_json(Path(workdir) / "report.json", report)
    gin_config.save_config(workdir, operative=True)
    return {k: float(v) for k, v in report.items() if isinstance(v, int | float)}


@gin.configurable
def train_marl(
    workdir: str,
    *,
    game: MarkovGame = gin.REQUIRED,
    trainer: MARLConfig | COMAConfig = MARLConfig(),
    seed: int = 0,
) -> dict:
    """Trains ``trainer`` (IPPO or MAPPO: a ``MARLConfig``; COMA: a ``COMAConfig``) on ``game``.

    ``metrics.jsonl``: per iteration each agent's ``episode_return`` and their mean, the losses
    and entropy.  ``report.json``: the trainer, the environment steps, ``final_return`` (the mean
    over agents and the last tenth of the iterations) and, in a matrix game, the learned mixed
    strategies and their Nash gap (``MatrixGame.nash_conv``, 0 at an equilibrium)."""
    name = trainer_name(trainer)
    os.makedirs(workdir, exist_ok=True)
    gin_config.save_config(workdir, operative=False)
    make = make_coma if name == "coma" else make_marl
    start = time.perf_counter()
    params, metrics = jax.jit(make(game, trainer))(jax.random.key(seed))
    metrics = jax.device_get(metrics)
    seconds = time.perf_counter() - start
    returns = np.asarray(metrics["episode_return"])  # [iterations, N]
    records = [
        {"step": i + 1, "return_mean": float(returns[i].mean())}
        | {k: np.asarray(v[i]).tolist() for k, v in metrics.items()}
        for i in range(trainer.num_iterations)
    ]
    tail = max(1, trainer.num_iterations // 10)
    report = {
        "trainer": name,
        "game": repr(game),
        "iterations": trainer.num_iterations,
        "env_steps": trainer.num_iterations * trainer.num_envs * trainer.num_steps,
        "final_return": float(returns[-tail:].mean()),
        "seconds": seconds,
    }
    if isinstance(game, MatrixGame):
        obs, _ = game.reset(jax.random.key(0))
        policies = np.asarray(jax.nn.softmax(policy_logits(params, obs)), np.float64)
        report |= {
            "payoffs": game.payoffs.tolist(),
            "policies": policies.tolist(),
            "nash_conv": game.nash_conv(policies),
        }
    return write_run(workdir, records, report)


@gin.configurable
def train_board_self_play(
    workdir: str,
    *,
    game: PgxEnv = gin.REQUIRED,
    config: BoardSelfPlayConfig = BoardSelfPlayConfig(),
    seed: int = 0,
) -> dict:
    """League self-play on a two-player pgx ``game`` (``classic_rl.board_self_play``).

    ``metrics.jsonl``: per generation the learner's win, draw and loss rates against a uniformly
    random player and against the first checkpoint, its entropy.  ``report.json``: the budget in
    games and the last generation's rates."""
    os.makedirs(workdir, exist_ok=True)
    gin_config.save_config(workdir, operative=False)
    start = time.perf_counter()
    _, metrics = jax.jit(make_board_self_play(game, config))(jax.random.key(seed))
    metrics = {k: np.asarray(v) for k, v in jax.device_get(metrics).items()}
    seconds = time.perf_counter() - start
    records = [
        {"generation": g + 1} | {k: float(v[g]) for k, v in metrics.items()}
        for g in range(config.generations)
    ]
    report = {
        "trainer": "league_self_play",
        "game": repr(game),
        "generations": config.generations,
        "training_games": config.generations * config.iterations * config.batch,
        "eval_games": config.eval_games,
        "seconds": seconds,
    } | {k: float(v[-1]) for k, v in metrics.items() if k.startswith("vs_")}
    return write_run(workdir, records, report)
