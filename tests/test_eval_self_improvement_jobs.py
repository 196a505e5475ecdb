"""The self-improvement loops as jobs of ``agentic-jax train``: the two shipped configs run
end to end through the command line (their scripted runs' every decision is known in advance
and checked in the files they write), and self-instruct's rounds stop when a learner makes the
policy worse on the held-out split."""

import json

import gin
import pytest

from agentic_jax.agents.policies.base import ScriptedPolicy
from agentic_jax.cli import main
from agentic_jax.data.datasets import read_conversations
from agentic_jax.envs.text import Arithmetic
from agentic_jax.eval.suites.self_improvement import ChangeLog
from agentic_jax.eval.suites.self_instruct import SeededTasks, self_instruct_job
from agentic_jax.eval.suites.suite import Suite

FAMILY = Arithmetic(1)


def train(config, workdir):
    try:
        return main(["train", "--gin_file", config, "--workdir", str(workdir)])
    finally:
        gin.clear_config()


def records(path, event):
    return [r for r in ChangeLog(path).records() if r["event"] == event]


def test_the_harness_job_accepts_rejects_and_stops_when_heldout_success_drops(tmp_path):
    assert train("self_improve_harness", tmp_path) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["stop_reason"] == "heldout_dropped"
    assert (report["rounds"], report["accepted"]) == (3, 1)
    assert (report["start_success"], report["success"]) == (0.5, 0.0)
    assert report["harness"]["system_prompt"].startswith("Compute every step")
    assert report["harness"]["tool_descriptions"] == {}  # the rejected edit was not applied
    decisions = records(tmp_path / "changes.jsonl", "decision")
    assert [(d["incumbent"], d["candidate"], d["accepted"]) for d in decisions] == [
        (0.5, 1.0, True),
        (1.0, 0.5, False),
    ]
    operative = (tmp_path / "operative_config.gin").read_text()
    assert "run_job.job = @eval.improve_harness_job" in operative
    assert "heldout/Suite.first_seed = 100" in (tmp_path / "config.gin").read_text()


def test_the_self_instruct_job_writes_verified_data_from_the_policys_own_problems(tmp_path):
    assert train("self_instruct", tmp_path) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report == {
        "rounds": 1,
        "stop_reason": "rounds",
        "start_success": 0.5,
        "success": 0.5,
        "generated": 5,
        "kept": 1,
        "rejected": 4,
        "trajectories": 1,
    }
    tasks = records(tmp_path / "round_1" / "self_instruct.jsonl", "task")
    assert [(t["question"], t["kept"]) for t in tasks] == [
        ("What is 6 * 7?", True),
        ("What is 9 - 3?", False),
        ("What is 8 / 3?", False),
        ("What is 2 * 11?", False),
        ("What is 6 * 7?", False),
    ]
    assert tasks[3]["reason"] == "a problem of the excluded evaluation suite"  # held-out's
    [chat] = read_conversations(tmp_path / "round_1" / "sft.jsonl")
    assert chat.messages[1].content == "What is 6 * 7?"
    assert chat.messages[-1].content.endswith(f"<answer>{6 * 7}</answer>")
    operative = (tmp_path / "operative_config.gin").read_text()
    assert "run_job.job = @eval.self_instruct_job" in operative


def said(*answers):
    return ScriptedPolicy([f"<think>.</think><answer>{a}</answer>" for a in answers])


def test_self_instruct_rounds_stop_when_the_learned_policy_drops_on_heldout(tmp_path):
    heldout = Suite(name="heldout", generators=(FAMILY,), num_tasks=2, first_seed=100)
    right = {"heldout": ["22", "50"], "new": ["-4", "4"]}  # seeds 100, 101; 0, 1
    # round 1's data comes from the start policy, round 2's from the first learned one
    start = said("22", "0", "-4", "0", "4", "4")  # held-out 1 of 2; task 0 half solved
    learned = [said("22", "50", "-4", "0", "0", "0"), said("0", "0")]  # 2 of 2, then 0 of 2
    taught = []

    def learn(policy, sft_file, round_dir):
        taught.append((policy, sft_file, round_dir, read_conversations(sft_file)))
        return learned[len(taught) - 1]

    gin.parse_config(["eval.self_instruct.attempts = 2"])
    try:
        result = self_instruct_job(
            str(tmp_path),
            policy=start,
            generate=SeededTasks(generators=(FAMILY,), count=2),
            heldout=heldout,
            learn=learn,
            rounds=5,
        )
    finally:
        gin.clear_config()
    assert right["new"] == [FAMILY.sample(s).answer for s in (0, 1)]
    assert right["heldout"] == [t.answer for t, _, _ in heldout.problems()]
    assert (result["rounds"], result["start_success"], result["success"]) == (2.0, 0.5, 0.0)
    assert json.loads((tmp_path / "report.json").read_text())["stop_reason"] == "heldout_dropped"
    assert [t[0] for t in taught] == [start, learned[0]]  # each round learns from the last
    assert [t[2].name for t in taught] == ["round_1", "round_2"]
    assert [len(t[3]) for t in taught] == [1, 1]  # task 0 in the band both times
    assert not (tmp_path / "round_3").exists()
    measured = records(tmp_path / "rounds.jsonl", "measure")
    assert [(m["round"], m["success"]) for m in measured] == [(0, 0.5), (1, 1.0), (2, 0.0)]


def test_more_than_one_round_needs_a_learner(tmp_path):
    with pytest.raises(ValueError, match="a learner"):
        self_instruct_job(str(tmp_path), policy=said(), generate=list, heldout=Suite(), rounds=2)
