"""bench/rl_rollouts.py at a tiny size: both arms spend the same budget on the same tasks (not speed)."""

import pathlib
import sys

from tiny_models import task_model_dir

from agentic_jax.envs.text import Arithmetic
from agentic_jax.post_training.tasks import TaskSpec

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # the repository root: bench/
from bench import rl_rollouts


def test_the_bench_runs_the_main_jobs_rl_tasks():
    tasks = rl_rollouts.main_job_tasks()
    assert [g.difficulty for g in tasks.generators] == [2]
    assert tasks.first_seed == 100_000 and (tasks.max_length, tasks.action_length) == (224, 40)
    assert all(len(g.reward.terms) == 2 for g in tasks.generators)  # partial_credit = False


def test_both_arms_count_the_same_steps_and_episodes(tmp_path):
    task_model_dir(tmp_path, max_seq_len=224)
    tasks = TaskSpec(generators=(Arithmetic(1),), num_train=8, max_length=176, action_length=32)
    records = rl_rollouts.measure(str(tmp_path), tasks, steps=2, prompts=2, group_size=2)
    assert set(records) == set(rl_rollouts.BACKENDS)
    table = rl_rollouts.summarize(records)
    for backend, rows in records.items():
        assert [r["step"] for r in rows] == [1, 2, 3]
        assert all(r["episodes"] == 4 and r["generation_seconds"] > 0 for r in rows)
        row = table[backend]
        assert (row["steps"], row["episodes"]) == (2, 8)  # the compile step is left out
        assert row["policy_tokens"] == sum(r["policy_tokens"] for r in rows[1:])
    assert table["generate"]["episodes"] == table["engine"]["episodes"]
