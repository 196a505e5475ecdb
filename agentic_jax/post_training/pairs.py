"""Preference pairs: chosen/rejected rows from task demonstrations, preference files or sampled
groups.

A pair batch is a dict of numpy arrays with one row per pair: ``chosen`` / ``rejected`` token
rows ``int32 [P, L]``, their completion masks ``chosen_mask`` / ``rejected_mask`` (1 on the
tokens the preference is about: the assistant's), and a ``weight [P]`` (a pair's share of the
batch loss).  Every row is right-padded to the same ``L`` (the env's ``max_length``), so one
compiled program serves every batch; held-out sets go through it in padded chunks
(`evaluate_loss`, `map_rows`).  `Progress` is what the pair trainers checkpoint: the train state
and how far they have read.  KTO's unpaired batch (`unpaired_rows`) has the same layout with
``completion`` / ``mismatched`` rows and a ``desirable [N]`` label in place of the pair's sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.data.chat import Message, render_ids, with_tools
from agentic_jax.data.datasets import Preference, Unpaired, read_preferences, read_unpaired
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.envs.text import demonstration_batch
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training.state import TrainState


def task_pairs(spec: TaskSpec, tokenizer: Tokenizer, split: str = "train") -> dict[str, np.ndarray]:
    """One pair per task of ``split``: its demonstration (chosen) against its corrupted
    continuation (rejected, a wrong final answer), rows of ``spec.max_length`` tokens."""
    tasks = spec.tasks(split)
    chosen, chosen_mask = demonstration_batch(tasks, tokenizer, spec.max_length, correct=True)
    rejected, rejected_mask = demonstration_batch(tasks, tokenizer, spec.max_length, correct=False)
    return {
        "chosen": chosen,
        "chosen_mask": chosen_mask,
        "rejected": rejected,
        "rejected_mask": rejected_mask,
        "weight": np.ones(len(tasks), np.float32),
    }


def completion_row(
    prompt: Sequence[Message], completion: Sequence[Message], tokenizer: Tokenizer, length: int
) -> tuple[np.ndarray, np.ndarray, str | None]:
    """``(ids [length], mask [length], problem)`` of ``prompt`` continued by ``completion``: the
    mask covers the completion's assistant tokens only (not those of a multi-turn prompt);
    ``problem`` says why the row cannot train (too long, nothing to learn), else None."""
    ids, mask = np.zeros(length, np.int32), np.zeros(length, np.int32)
    start = len(render_ids(prompt, tokenizer).ids)
    rendered = render_ids([*prompt, *completion], tokenizer)
    if len(rendered.ids) > length:
        return ids, mask, f"takes {len(rendered.ids)} tokens with its prompt > {length}"
    ids[: len(rendered.ids)] = rendered.ids
    mask[: len(rendered.ids)] = np.where(
        np.arange(len(rendered.ids)) < start, 0, rendered.assistant_mask
    )
    return ids, mask, None if mask.any() else "has no assistant turn to learn from"


def record_pairs(
    records: Sequence[Preference], tokenizer: Tokenizer, length: int
) -> dict[str, np.ndarray]:
    """One pair per record (``data.datasets.read_preferences``): its prompt, with its tools in
    the system message, continued by ``chosen`` and by ``rejected``, rows of ``length`` tokens
    (`completion_row`)."""
    batch = {
        key: np.zeros((len(records), length), np.int32)
        for key in ("chosen", "chosen_mask", "rejected", "rejected_mask")
    }
    for row, record in enumerate(records):
        prompt = with_tools(record.prompt, record.tools)
        for side in ("chosen", "rejected"):
            ids, mask, problem = completion_row(prompt, getattr(record, side), tokenizer, length)
            if problem:
                raise record.source.error(side, problem)
            batch[side][row], batch[f"{side}_mask"][row] = ids, mask
    return {**batch, "weight": np.ones(len(records), np.float32)}


def unpaired_rows(
    records: Sequence[Unpaired], tokenizer: Tokenizer, length: int
) -> dict[str, np.ndarray]:
    """KTO's batch (``data.datasets.read_unpaired``): per record its ``completion`` row (prompt
    and completion, `completion_row`), ``desirable [N]`` (1.0 or 0.0), and a ``mismatched`` row
    (its prompt continued by the previous record's completion, TRL's shift) from which the
    trainer estimates KTO's reference point KL(π ‖ π_ref); rows of ``length`` tokens."""
    if len(records) < 2:
        raise ValueError(
            f"KTO estimates its reference point from mismatched prompts and completions: "
            f"{records[0].source.path if records else 'the file'} needs >= 2 records"
        )
    batch = {
        key: np.zeros((len(records), length), np.int32)
        for key in ("completion", "completion_mask", "mismatched", "mismatched_mask")
    }
    for row, record in enumerate(records):
        prompt = with_tools(record.prompt, record.tools)
        ids, mask, problem = completion_row(prompt, record.completion, tokenizer, length)
        if problem:
            raise record.source.error("completion", problem)
        batch["completion"][row], batch["completion_mask"][row] = ids, mask
        other = records[row - 1].completion
        ids, mask, problem = completion_row(prompt, other, tokenizer, length)
        if problem:
            raise record.source.error(
                "prompt", f"with the previous record's completion (KTO's KL row) {problem}"
            )
        batch["mismatched"][row], batch["mismatched_mask"][row] = ids, mask
    return {
        **batch,
        "desirable": np.asarray([r.desirable for r in records], np.float32),
        "weight": np.ones(len(records), np.float32),
    }


def pair_splits(
    spec: TaskSpec,
    tokenizer: Tokenizer,
    pairs_file: str | None = None,
    heldout_file: str | None = None,
    *,
    unpaired: bool = False,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """``(train, heldout)`` pair batches of ``spec.max_length`` tokens: the pairs of the
    preference files (JSONL or Parquet in TRL's formats) when ``pairs_file`` is given (held out:
    ``heldout_file``'s, or None), else :func:`task_pairs` of both splits.  ``unpaired``: the
    files hold KTO's labelled completions instead, read into :func:`unpaired_rows`."""
    if pairs_file is None:
        if unpaired:
            raise ValueError("KTO trains on labelled completions: set unpaired_file")
        if heldout_file is not None:
            raise ValueError("heldout_pairs_file is set without pairs_file")
        return task_pairs(spec, tokenizer, "train"), task_pairs(spec, tokenizer, "heldout")
    read, rows = (read_unpaired, unpaired_rows) if unpaired else (read_preferences, record_pairs)
    train, heldout = (
        rows(read(path), tokenizer, spec.max_length) if path else None
        for path in (pairs_file, heldout_file)
    )
    return train, heldout


def take(batch: dict[str, np.ndarray], rows) -> dict[str, np.ndarray]:
    """The given rows of every array of ``batch``."""
    return {k: v[rows] for k, v in batch.items()}


def best_worst(scores) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(best [P], worst [P], decisive [P])`` of ``scores [P, k]`` (k samples of each prompt).

    ``best`` / ``worst`` are flat row indices ``p·k + j`` of each prompt's highest and lowest
    score (the first one on ties); ``decisive`` is False where all k scores are equal, a prompt
    that says nothing about which sample is better.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[1] < 2:
        raise ValueError(
            f"scores must be [prompts, k] with k >= 2 samples per prompt, got shape {scores.shape}"
        )
    offset = np.arange(scores.shape[0]) * scores.shape[1]
    best, worst = scores.argmax(axis=1), scores.argmin(axis=1)
    decisive = scores.max(axis=1) > scores.min(axis=1)
    return offset + best, offset + worst, decisive


def sampled_pairs(tokens, mask, scores, samples_per_prompt: int) -> dict[str, np.ndarray] | None:
    """The best/worst sample of each decisive prompt as a pair batch of ``P`` rows (one per prompt).

    ``tokens`` / ``mask`` are ``[P·k, L]`` and ``scores [P·k]``, prompt-major (rows ``p·k ..
    p·k + k - 1`` share prompt ``p``, as ``rollout.collect`` returns them).  Tied prompts' slots
    are filled with the decisive pairs again, cyclically, and each pair's weights add up to 1,
    so the shapes stay fixed and the loss is the plain mean over decisive pairs.  The pairs'
    scores come along as ``chosen_score`` / ``rejected_score [P]``.  None when no prompt is
    decisive.
    """
    tokens, mask = np.asarray(tokens), np.asarray(mask)
    scores = np.asarray(scores, np.float64).reshape(-1, samples_per_prompt)
    best, worst, decisive = best_worst(scores)
    if not decisive.any():
        return None
    slots = np.resize(
        np.flatnonzero(decisive), len(decisive)
    )  # decisive prompts, repeated cyclically
    weight = 1.0 / np.bincount(slots, minlength=len(decisive))[slots]
    return {
        "chosen": tokens[best[slots]],
        "chosen_mask": mask[best[slots]],
        "rejected": tokens[worst[slots]],
        "rejected_mask": mask[worst[slots]],
        "weight": weight.astype(np.float32),
        "chosen_score": scores.reshape(-1)[best[slots]],
        "rejected_score": scores.reshape(-1)[worst[slots]],
    }


def padded_chunks(batch: dict[str, np.ndarray], size: int) -> Iterator[dict[str, np.ndarray]]:
    """Slices of ``size`` rows of ``batch``; the last is padded with weight-0 copies of the first
    rows, so one compiled program evaluates them all (``weight`` is added if absent)."""
    rows = len(next(iter(batch.values())))
    batch = {**batch, "weight": batch.get("weight", np.ones(rows, np.float32))}
    for start in range(0, rows, size):
        chunk = take(batch, np.arange(start, start + size) % rows)
        chunk["weight"] = np.where(
            np.arange(start, start + size) < rows, chunk["weight"], 0.0
        ).astype(np.float32)
        yield chunk


def map_rows(
    fn: Callable[[dict], np.ndarray], batch: dict[str, np.ndarray], size: int
) -> np.ndarray:
    """``fn`` (per-row outputs ``[size, ...]``) over every row of ``batch`` in chunks of ``size``."""
    rows = len(next(iter(batch.values())))
    return np.concatenate([np.asarray(fn(chunk)) for chunk in padded_chunks(batch, size)])[:rows]


def evaluate_loss(
    loss, params, batch: dict[str, np.ndarray], size: int
) -> tuple[float, float, dict]:
    """``(mean loss, count, metric sums)`` of a sum-and-count ``loss(params, batch, key)`` (as
    ``training.make_update`` takes it) over every row of ``batch``, in chunks of ``size`` rows."""
    sums = None
    for chunk in padded_chunks(batch, size):
        out = jax.device_get(loss(params, chunk, None))
        sums = out if sums is None else jax.tree.map(np.add, sums, out)
    total, count, metrics = sums
    return float(total) / max(float(count), 1e-9), float(count), metrics


@struct.dataclass
class Progress:
    """A trainer's `TrainState` and how many examples (pairs or prompts) it has drawn: a
    checkpoint holds both, so a resumed run draws the examples the interrupted one would have."""

    train: TrainState
    position: jax.Array  # int32 []

    @classmethod
    def resume(cls, run, trainable, optimizer, seed: int, meta: dict) -> tuple[Progress, dict, int]:
        """``(progress, meta, step)`` from a `TrainerRun`: its latest checkpoint, else a fresh
        state at position 0."""
        return run.start(cls(TrainState.create(trainable, optimizer, seed), jnp.int32(0)), meta)
