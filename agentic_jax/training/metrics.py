"""Run records: a JSONL metrics log that survives restarts, and the loss-curve plot."""

from __future__ import annotations

import json
import os

import numpy as np


class MetricsLog:
    """Appends one JSON object per record to ``path``.

    On resume from step s the records of steps > s (written after the checkpoint the run restarts
    from) are dropped, so the log reads as one uninterrupted run.
    """

    def __init__(self, path: str, resume_step: int = 0):
        self.path = path
        records = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)

    def write(self, record: dict) -> None:
        clean = {
            k: (v.item() if isinstance(v, np.generic | np.ndarray) else v)
            for k, v in record.items()
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")


def read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(
    records: list[dict], path: str, *, keys=("loss", "eval_loss"), title: str = ""
) -> str:
    """Plots each key present in the records against ``step`` (and the held-out unigram entropy,
    the loss to beat, when recorded) and writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key in keys:
        points = [(r["step"], r[key]) for r in records if key in r]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, label=key, marker="o" if len(points) < 30 else None)
    baseline = [r["heldout_unigram_entropy"] for r in records if "heldout_unigram_entropy" in r]
    if baseline:
        ax.axhline(baseline[-1], color="gray", linestyle="--", label="held-out unigram entropy")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
