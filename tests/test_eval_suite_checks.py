"""What an agent-suite report says beside success: contamination and self-consistency calibration.

Calibration is checked on constructed trials whose ECE is computed by hand; contamination on a
constructed corpus, and on the main job's own training sets: held-out problems of the trained
kinds are clean, problems at training seeds are found where they were trained on.
"""

import gin
import pytest

from agentic_jax import config as gin_config
from agentic_jax.envs.text import Arithmetic, MultiHop
from agentic_jax.eval.agent_metrics import Episode
from agentic_jax.eval.suites.consistency import calibration, calibration_markdown
from agentic_jax.eval.suites.episodes import task_id
from agentic_jax.eval.suites.suite import Suite
from agentic_jax.eval.suites.training_data import (
    TrainingData,
    contamination,
    contamination_markdown,
)


def _episode(task, success, answer, trial=0):
    return Episode(task, "h", "v", trial, 0, success, answer=answer)


def test_self_consistency_confidence_and_its_ece_by_hand():
    trials = {
        # all three agree and are right: confidence 1, correct
        "a": [(True, "<think>2 + 3</think><answer>5</answer>")] * 3,
        # 7 twice (wrong, though reasoned differently), 8 once (right): confidence 2/3, wrong
        "b": [
            (False, "<think>x</think><answer>7</answer>"),
            (True, "<answer>8</answer>"),
            (False, "<think>y</think><answer> 7 </answer>"),
        ],
        # 4, no answer, 9: the tie goes to the earlier 4 (right), confidence 1/3
        "c": [(True, "<answer>4</answer>"), (False, None), (False, "<answer>9</answer>")],
        # no trial answered: confidence 0, wrong
        "d": [(False, None)] * 3,
    }
    episodes = [
        _episode(task, success, answer, i)
        for task, outcomes in trials.items()
        for i, (success, answer) in enumerate(outcomes)
    ]
    section = calibration(episodes)
    tasks = section["tasks"]
    assert [tasks[t]["answer"] for t in "abcd"] == ["5", "7", "4", None]
    assert [tasks[t]["confidence"] for t in "abcd"] == pytest.approx([1, 2 / 3, 1 / 3, 0])
    assert [tasks[t]["correct"] for t in "abcd"] == [True, False, True, False]
    # Ten bins, each task alone in its bin: |1 - 1|, |0 - 2/3|, |1 - 1/3|, |0 - 0| over 4 tasks.
    assert section["ece"] == pytest.approx((0 + 2 / 3 + 2 / 3 + 0) / 4)
    assert section["trials"] == 3 and section["accuracy"] == 0.5
    assert [b["count"] for b in section["bins"]] == [1, 1, 1, 1]
    assert "| original | 4 | 0.500 | 0.500 | 0.333 |" in calibration_markdown({"original": section})


def test_one_trial_per_task_gives_no_calibration_number():
    section = calibration([_episode("a", True, "<answer>1</answer>")])
    assert "ece" not in section and section["trials"] == 1
    assert "needs at least 2 trials" in calibration_markdown({"original": section})[-1]


def test_the_clean_subset_success_leaves_out_the_copied_problem(tmp_path):
    suite = Suite(generators=(Arithmetic(2),), num_tasks=4, seeds=(0, 1))
    tasks = [t for t, _, _ in suite.problems()]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(f"Homework, page 3. {tasks[0].prompt[-1].content} Show your work.")
    outcomes = [(True, True), (False, True), (False, False), (True, False)]
    episodes = [
        _episode(task_id(t), success, None, trial)
        for t, trials in zip(tasks, outcomes)
        for trial, success in enumerate(trials)
    ]
    section = contamination(suite, {"original": episodes}, TrainingData(corpus=[str(corpus)]))
    assert [section["items"][task_id(t)]["flagged"] for t in tasks] == [True, False, False, False]
    assert section["items"][task_id(tasks[0])]["sources"] == ["pretraining corpus"]
    assert section["fraction_flagged"] == 0.25 and section["min_n"] == 7  # "what is a + b * c"
    # All 8 episodes: 4 successes; the 6 of the clean problems: 2; the copied one's: 2 of 2.
    assert section["variants"]["original"] == pytest.approx(
        {"success": 0.5, "clean": 1 / 3, "flagged": 1.0}
    )
    text = "\n".join(contamination_markdown(section))
    assert "1 of 4 problems (25.0%)" in text and "| original | 0.500 | 0.333 | 1.000 |" in text
    off = contamination(suite, {"original": episodes}, TrainingData(enabled=False))
    assert off == {"checked": False} and "Not checked" in contamination_markdown(off)[-1]


class Problems:
    """Just what the check reads of a suite: its problems."""

    def __init__(self, tasks):
        self.tasks = tasks

    def problems(self):
        return [(t, (), None) for t in self.tasks]


def test_held_out_problems_are_clean_and_training_problems_are_found():
    gin_config.parse(["training_data"], [])
    try:
        data = TrainingData(corpus=[])  # the main job's SFT and RL sets, as configured
    finally:
        gin.clear_config()
    heldout = range(1_000_000, 1_000_010)
    groups = {
        "heldout": [
            t for g in (Arithmetic(2), Arithmetic(3), MultiHop(2)) for t in g.tasks(heldout)
        ],
        "heldout_d1": Arithmetic(1).tasks(heldout),
        "sft": [t for g in (Arithmetic(1), Arithmetic(2)) for t in g.tasks(range(5))],
        "rl": Arithmetic(2).tasks(range(100_000, 100_005)),
    }
    every = [t for group in groups.values() for t in group]
    items = contamination(Problems(every), {}, data)["items"]

    def sources(group):
        return [items[task_id(t)]["sources"] for t in groups[group]]

    assert sources("heldout") == [[]] * 30
    assert all("SFT demonstrations" in s for s in sources("sft"))
    assert sources("rl") == [["RL prompts"]] * 5
    # One-operator arithmetic has 14 * 14 * 3 = 588 questions and SFT draws 1,500 of them: held
    # out by seed, most are still SFT problems.  In the RL prompts they only begin longer
    # questions ("What is 10 - 7?" in "What is 10 - 7 * 3?"), which does not count.
    assert sum(s == ["SFT demonstrations"] for s in sources("heldout_d1")) >= 8
    rl_questions = [t.prompt[-1].content for t in Arithmetic(2).tasks(range(100_000, 101_000))]
    assert any(
        q.startswith(t.prompt[-1].content[:-1] + " ")
        for t in groups["heldout_d1"]
        for q in rl_questions
    )
