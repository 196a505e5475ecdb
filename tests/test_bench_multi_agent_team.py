"""bench/multi_agent.py's team RL vs single-agent RL on a tiny model: both arms start from the same
model, GRPO spends at least the team's generated tokens (solver's and verifier's, counted), and
each arm's held-out success comes with its bootstrap interval and its paired difference."""

import argparse
import pathlib
import sys

import numpy as np
from tiny_models import task_model_dir

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from agentic_jax.post_training.team_rl import VERDICT_LENGTH
from bench import multi_agent as bench

TINY = [
    "rl/TaskSpec.generators = [@one/agentic_jax.envs.text.Arithmetic()]",
    "rl/TaskSpec.num_train = 8",
    "rl/TaskSpec.num_heldout = 2",
    "rl/TaskSpec.max_length = 128",
    "rl/TaskSpec.action_length = 16",
]


def test_grpo_gets_at_least_the_teams_tokens_from_the_same_start(tmp_path):
    task_model_dir(tmp_path, max_seq_len=128 + VERDICT_LENGTH)
    args = argparse.Namespace(
        sft=str(tmp_path),
        gin_param=TINY,
        team_steps=1,
        team_samples=1,
        team_lr=1e-3,
        group_size=2,
        prompts_per_step=2,
    )
    rows = bench.team_rows(args)
    assert list(rows) == ["start", "team", "grpo"]
    team, grpo = rows["team"], rows["grpo"]
    assert team["generated_tokens"] == team["solver_tokens"] + team["verifier_tokens"]
    verdicts = 2 * 2  # one per solver episode: group x prompts, one step
    assert verdicts <= team["verifier_tokens"] <= VERDICT_LENGTH * verdicts
    assert grpo["generated_tokens"] >= team["generated_tokens"] and grpo["steps"] >= 1
    for name, row in rows.items():
        assert len(row["pass@1"]) == 2  # the held-out problems
        mean, low, high = row["success"]
        assert low <= mean <= high and mean == np.mean(row["pass@1"])
        assert ("vs_start" in row) == (name != "start")
