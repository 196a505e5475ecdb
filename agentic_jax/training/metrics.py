"""Run records: a JSONL metrics log that survives restarts, optionally mirrored to TensorBoard,
and the loss-curve plot."""

from __future__ import annotations

import json
import numbers
import os
import time

import gin
import numpy as np

TENSORBOARD_DIR = "tensorboard"


@gin.configurable(allowlist=["tensorboard"])
class MetricsLog:
    """Appends one JSON object per record to ``path``.

    On resume from step s the records of steps > s (written after the checkpoint the run restarts
    from) are dropped, so the log reads as one uninterrupted run.

    With ``tensorboard`` (gin ``MetricsLog.tensorboard = True``) every number of a record is also
    a TensorBoard scalar at the record's ``step``, in an event file under ``tensorboard/`` beside
    the log; text, lists and flags stay in the JSONL alone.  Each run (and each resume) writes a
    file of its own that starts with a session start at step s + 1, which tells TensorBoard to hide
    the older files' events from that step on, as it hides the JSONL's.  A log to ``os.devnull``
    (a process that does not write records) writes no event file either.
    """

    def __init__(self, path: str, resume_step: int = 0, *, tensorboard: bool = False):
        self.path = path
        records = [r for r in read_metrics(path) if r.get("step", 0) <= resume_step]
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        self._events = None
        if tensorboard and path != os.devnull:
            directory = os.path.join(os.path.dirname(os.path.abspath(path)), TENSORBOARD_DIR)
            self._events = _event_file(directory, resume_step)

    def write(self, record: dict) -> None:
        clean = {
            k: (v.item() if isinstance(v, np.generic | np.ndarray) else v)
            for k, v in record.items()
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self._events is not None:
            self._write_scalars(clean)

    def _write_scalars(self, record: dict) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary

        values = [
            Summary.Value(tag=k, simple_value=float(v))
            for k, v in record.items()
            if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)
        ]
        if values:
            step = record.get("step", 0)
            self._events.write_event(
                Event(wall_time=time.time(), step=step, summary=Summary(value=values))
            )
            self._events.flush()


def _event_file(directory: str, resume_step: int):
    """A new event file in ``directory`` through tensorboardX's synchronous writer (each record
    is on disk when ``write`` returns, as the JSONL's is; ``SummaryWriter`` queues them for a
    thread), opened with the session start at ``resume_step + 1`` that ``SummaryWriter``'s
    ``purge_step`` writes.  Named by the time, the host and the resume step, so a resume in the
    same second neither overwrites the file before it nor sorts before it."""
    # tensorboardX imports torch when it is installed (a second or more): only when asked for.
    from tensorboardX.event_file_writer import EventsWriter
    from tensorboardX.proto.event_pb2 import Event, SessionLog

    os.makedirs(directory, exist_ok=True)
    events = EventsWriter(os.path.join(directory, "events"), f".{resume_step:012d}")
    start = SessionLog(status=SessionLog.START)
    events.write_event(Event(wall_time=time.time(), step=resume_step + 1, session_log=start))
    events.flush()
    return events


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
