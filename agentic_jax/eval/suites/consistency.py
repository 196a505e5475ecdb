"""Calibration of an agent suite's answers from its trials alone: self-consistency confidence.

A checkpoint's token probabilities have no counterpart at most endpoints, and an agent's answer
ends several turns, so the confidence used here needs nothing but the answers, for any backend:
over a task's trials (seeds x trials), the confidence is the share of trials that give the
majority answer, and the prediction is that answer, right when the verifier accepted an episode
that gave it.  This is self-consistency (Wang et al. 2022, arXiv:2203.11171) read as a
confidence, the consistency-based confidence that Xiong et al. 2024 (arXiv:2306.13063) find
better calibrated than the confidence a model states.  The ECE, reliability bins and diagram
are `agentic_jax.eval.calibration`'s.

Answers are compared by their ``<answer>`` text (`answer_text`; the stripped reply when there
is none), ties go to the earliest trial (`majority_vote`), and a trial without an answer never
wins but counts in the share.  With one trial per task every confidence would be 1, so the
report then says that calibration needs two or more trials instead of giving a number; with
``k`` trials the confidences are multiples of ``1/k``, so only a few bins fill.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from agentic_jax.envs.text.rewards import answer_text
from agentic_jax.eval.agent_metrics import Episode
from agentic_jax.eval.calibration import (
    expected_calibration_error,
    reliability_bins,
    reliability_diagram,
)
from agentic_jax.files import atomic_write
from agentic_jax.reasoning import majority_vote

BINS = 10


def answer_key(answer: str | None) -> str | None:
    """What two trials must share to give the same answer."""
    if answer is None:
        return None
    inner = answer_text(answer)
    return inner if inner is not None else answer.strip()


def self_consistency(episodes: Sequence[Episode]) -> dict[str, dict]:
    """Per task: the majority answer of its trials, its share of them (the confidence) and
    whether it is right (0 and wrong when no trial answered)."""
    by_task: dict[str, list[Episode]] = {}
    for e in episodes:
        by_task.setdefault(e.task_id, []).append(e)
    out = {}
    for task, trials in by_task.items():
        keys = [answer_key(e.answer) for e in trials]
        majority = majority_vote(keys)
        votes = keys.count(majority) if majority is not None else 0
        out[task] = {
            "answer": majority,
            "confidence": votes / len(keys),
            "correct": bool(votes and trials[keys.index(majority)].success),
        }
    return out


def calibration(episodes: Sequence[Episode], n_bins: int = BINS) -> dict:
    """The calibration of one variant's episodes: ECE, the filled reliability bins, accuracy
    and mean confidence of the majority answers, and each task's; only ``trials`` and why not
    when a task has fewer than two trials."""
    tasks = self_consistency(episodes)
    trials = min(collections.Counter(e.task_id for e in episodes).values())
    if trials < 2:
        return {"trials": trials, "needs": "at least 2 trials per task (seeds x trials)"}
    confidence = np.array([t["confidence"] for t in tasks.values()])
    correct = np.array([t["correct"] for t in tasks.values()])
    count, mean_confidence, accuracy = reliability_bins(confidence, correct, n_bins)
    return {
        "trials": trials,
        "ece": expected_calibration_error(confidence, correct, n_bins),
        "accuracy": float(correct.mean()),
        "confidence": float(confidence.mean()),
        "bins": [
            {"count": int(c), "confidence": float(m), "accuracy": float(a)}
            for c, m, a in zip(count, mean_confidence, accuracy)
            if c
        ],
        "tasks": tasks,
    }


def write_reliability(section: dict, path: str | Path, title: str) -> bool:
    """Writes the reliability diagram of a calibration section to ``path``; False (nothing
    written) when the section has no calibration."""
    if "ece" not in section:
        return False
    tasks = section["tasks"].values()
    with atomic_write(path, "wb") as f:
        reliability_diagram(
            [t["confidence"] for t in tasks], [t["correct"] for t in tasks], f, BINS, title
        )
    return True


def calibration_markdown(sections: dict[str, dict]) -> list[str]:
    """The report's "Calibration" section, one row per variant."""
    lines = ["", "## Calibration (self-consistency)", ""]
    first = next(iter(sections.values()))
    if "ece" not in first:
        return lines + [
            f"Not measured: calibration needs {first['needs']}, this run has {first['trials']}."
        ]
    lines += [
        "| variant | tasks | majority correct | mean confidence | ECE |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, s in sections.items():
        lines.append(
            f"| {name} | {len(s['tasks'])} | {s['accuracy']:.3f} | {s['confidence']:.3f} | "
            f"{s['ece']:.3f} |"
        )
    return lines + [
        "",
        f"Confidence: the share of a task's {first['trials']} trials that give its majority "
        f"answer; ECE over {BINS} equal-width bins. `reliability.png`: the first variant.",
    ]
