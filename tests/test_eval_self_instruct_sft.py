"""Self-instruct that trains for real: `SFTLearner` fine-tunes a tiny checkpoint on a round's
verified trajectories with the project's SFT trainer, and the next round plays the new model."""

import json

import gin
import jax
import numpy as np
import pytest
from test_eval_self_improvement_jobs import FAMILY, records, said
from tiny_models import changed_weights, task_model_dir

from agentic_jax.agents.policies.jax_policy import JaxPolicy
from agentic_jax.cli import main
from agentic_jax.eval.suites import self_instruct
from agentic_jax.eval.suites.self_instruct import SeededTasks, SFTLearner, self_instruct_job
from agentic_jax.eval.suites.suite import Suite
from agentic_jax.models.export import load_checkpoint

SETTINGS = [
    "eval.self_instruct.attempts = 2",
    "eval.self_instruct.max_steps = 1",
    "eval.self_instruct.max_tokens = 4",
    "train_sft.steps = 3",
    "train_sft.batch_size = 1",
    "train_sft.seq_len = 320",
    "train_sft.peak_lr = 1e-2",
    "train_sft.warmup_steps = 1",
    "train_sft.eval_every = 0",
    "train_sft.checkpoint_every = 1000",
    "train_sft.progress = False",
]


def test_two_rounds_fine_tune_the_checkpoint_and_play_the_new_model(tmp_path, monkeypatch):
    base = tmp_path / "base"
    base.mkdir()
    task_model_dir(base, max_seq_len=320)
    heldout = Suite(
        name="heldout", generators=(FAMILY,), num_tasks=1, first_seed=100, max_tokens=4, max_steps=1
    )
    # The start policy (a scripted teacher) misses the held-out problem and solves task 0 once
    # in two attempts: round 1 keeps it.  The tiny model solves nothing: round 2 keeps nothing.
    start = said("0", "-4", "0")
    learner = SFTLearner(str(base))
    taught, started_from = [], []
    real_train_sft = self_instruct.train_sft

    def train_sft(workdir, *, init_from, chats_file):
        started_from.append(init_from)
        return real_train_sft(workdir, init_from=init_from, chats_file=chats_file)

    monkeypatch.setattr(self_instruct, "train_sft", train_sft)

    def learn(policy, sft_file, round_dir):
        trained = learner(policy, sft_file, round_dir)
        taught.append((policy, trained, round_dir.name))
        return trained

    job = tmp_path / "job"
    gin.parse_config(SETTINGS)
    try:
        tasks = {"generate": SeededTasks(generators=(FAMILY,), count=1), "heldout": heldout}
        result = self_instruct_job(str(job), policy=start, learn=learn, rounds=2, **tasks)
        # One more round on round 1's data: it fine-tunes round 1's model, not the base.
        again = learner(taught[-1][1], job / "round_1" / "sft.jsonl", tmp_path / "more")
    finally:
        gin.clear_config()
    (first_policy, first, first_round), (second_policy, second, second_round) = taught
    assert (first_policy, first_round, second_round) == (start, "round_1", "round_2")
    assert isinstance(first, JaxPolicy) and second_policy is first  # round 2 plays the new model
    assert second is first  # round 2 kept nothing, so nothing was trained
    trained_dir = job / "round_1" / "sft"
    assert not (job / "round_2" / "sft").exists()
    _, params, _ = load_checkpoint(trained_dir)
    served = first.model.params
    assert all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(served))
    )
    assert changed_weights(base / "model", trained_dir / "model")  # SFT moved the weights
    assert started_from == [str(base), str(trained_dir)]
    assert learner.checkpoint == str(tmp_path / "more" / "sft") and again is not first
    assert changed_weights(trained_dir / "model", tmp_path / "more" / "sft" / "model")
    with pytest.raises(ValueError, match="give it back the policy it returned"):
        learner(first, job / "round_1" / "sft.jsonl", tmp_path / "stale")
    metrics = [
        json.loads(line) for line in (trained_dir / "metrics.jsonl").read_text().splitlines()
    ]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    report = json.loads((job / "report.json").read_text())
    assert (report["rounds"], report["stop_reason"], report["kept"]) == (2, "rounds", 1)
    assert [r["round"] for r in records(job / "rounds.jsonl", "round")] == [1, 2]
    assert [m["round"] for m in records(job / "rounds.jsonl", "measure")] == [0, 1, 2]
    assert result["rounds"] == 2.0
    again.close()


def test_the_shipped_config_runs_rounds_of_the_checkpoints_policy(tmp_path):
    """``self_instruct_sft.gin`` on a tiny checkpoint that solves nothing: every round keeps
    nothing, so nothing is trained and the job runs all its rounds."""
    base = tmp_path / "base"
    base.mkdir()
    task_model_dir(base, max_seq_len=320)
    params = [
        f"SELF_INSTRUCT_CHECKPOINT = '{base}'",
        "eval.SeededTasks.count = 1",
        "heldout/eval.Suite.num_tasks = 1",
        "eval.self_instruct_job.rounds = 2",
        *SETTINGS,
    ]
    args = ["train", "--gin_file", "self_instruct_sft", "--workdir", str(tmp_path / "job")]
    try:
        assert main([*args, *(a for p in params for a in ("--gin_param", p))]) == 0
    finally:
        gin.clear_config()
    report = json.loads((tmp_path / "job" / "report.json").read_text())
    assert (report["rounds"], report["stop_reason"], report["kept"]) == (2, "rounds", 0)
    assert not list((tmp_path / "job").glob("round_*/sft"))
    operative = (tmp_path / "job" / "operative_config.gin").read_text()
    assert "SFTLearner.init_from = %SELF_INSTRUCT_CHECKPOINT" in operative
