"""Packing variable-length next-token examples into fixed ``[batch, seq_len]`` batches.

Every example is shifted *before* packing (``tokens = ids[:-1]``, ``targets = ids[1:]``), so a
target never crosses into the next document of a row and the loss mask needs no boundary rule.
First-fit packing pads instead of splitting, so segments start at position 0; examples must
therefore be at most ``seq_len`` long after the shift (``TokenizedCorpus.chunk_bounds`` does
that for text; the SFT trainer truncates or drops long conversations).

Batch features, all int32 ``[batch_size, seq_len]``:

* ``tokens``, ``targets``: model input and next-token labels, 0 on padding;
* ``segment_ids``: 1, 2, ... (consecutive) for the examples packed in a row, 0 on padding;
* ``positions``: position within the example, restarting at 0 in each segment;
* ``loss_mask``: 1 where the target is trained on (0 on padding and masked-out targets).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import grain
import numpy as np

_PACKED = ("tokens", "targets", "loss_mask")


def next_token_example(
    ids: Sequence[int] | np.ndarray, trained: Sequence[int] | np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Input/label pair predicting ``ids[1:]`` from ``ids[:-1]``.

    ``trained`` (per id, e.g. ``chat.render_ids(...).assistant_mask``) selects which *targets*
    count in the loss; by default all do.
    """
    ids = np.asarray(ids, np.int32)
    targets = ids[1:]
    if trained is not None and np.shape(trained) != ids.shape:
        # The packer lays out each feature by its own length: a mismatch would shift the mask
        # onto other documents' tokens and padding without any error.
        raise ValueError(f"trained has shape {np.shape(trained)}, but ids have shape {ids.shape}")
    loss_mask = np.ones_like(targets) if trained is None else np.asarray(trained, np.int32)[1:]
    return {"tokens": ids[:-1], "targets": targets, "loss_mask": loss_mask}


def _batch_features(row: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    features = {name: row[name] for name in _PACKED}
    features["segment_ids"] = row["tokens_segment_ids"]
    features["positions"] = row["tokens_positions"]
    return features


def padding_batch(batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    """A batch of padding rows only: every feature 0, as ``pack_batches`` fills its last batch."""
    return {
        name: np.zeros((batch_size, seq_len), np.int32)
        for name in _PACKED + ("segment_ids", "positions")
    }


def pack_batches(
    examples: grain.IterDataset,
    *,
    seq_len: int,
    batch_size: int,
    num_packing_bins: int,
    seed: int = 0,
    shuffle_bins: bool = True,
) -> grain.IterDataset:
    """First-fit packs ``next_token_example`` dicts into rows, then batches the rows.

    ``num_packing_bins`` rows are filled at once (more bins, less padding).  If the stream ends,
    its last batch is filled up with all-padding rows: no target is dropped and every batch
    has the same shape (no recompilation).  Examples without targets (from fewer than two ids)
    are skipped: packed, they would take a segment id but no position, and the ids of the row
    would skip a number.
    """
    examples = examples.filter(lambda example: len(example["targets"]) > 0)
    rows = grain.experimental.FirstFitPackIterDataset(
        examples,
        length_struct=dict.fromkeys(_PACKED, seq_len),
        num_packing_bins=num_packing_bins,
        seed=seed,
        shuffle_bins=shuffle_bins,
    )
    rows = rows.map(_batch_features)
    pad = functools.partial(grain.experimental.batch_and_pad, batch_size=batch_size)
    return rows.batch(batch_size, batch_fn=pad)
