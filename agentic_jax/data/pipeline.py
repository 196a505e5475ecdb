"""Language-modelling data: text files -> tokenized pieces -> shuffled, packed batches (grain).

The corpus is tokenized up front (and cached, see ``tokenized_corpus``) and cut into pieces of
at most ``seq_len + 1`` tokens, so the stream starts as a random-access ``grain.MapDataset``:
shuffling is a seeded index permutation (a new one every epoch) and the iterator state that
``get_state()`` returns is a few integers, whatever the position in training.

Checkpointing::

    it = iter(train_data(tokenizer))
    state = it.get_state()        # JSON-serialisable dict
    it = iter(train_data(tokenizer))
    it.set_state(state)           # continues with the very next batch

or inside an orbax checkpoint, ``grain.checkpoint.CheckpointSave(it)`` /
``grain.checkpoint.CheckpointRestore(it)`` as an item of ``ocp.args.Composite``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import gin
import grain
import numpy as np

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.packing import next_token_example, pack_batches, padding_batch
from agentic_jax.data.tokenized_corpus import TokenizedCorpus, tokenize_files
from agentic_jax.data.tokenizer import Tokenizer, load_tokenizer

# Tokens are already in memory: reader threads would only contend for the GIL.
_IN_MEMORY = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


class _Pieces:
    """Random-access source of ``next_token_example``s, one per (start, end) piece."""

    def __init__(self, corpus: TokenizedCorpus, seq_len: int):
        self._tokens = corpus.tokens
        self._bounds = corpus.chunk_bounds(seq_len + 1)

    def __len__(self) -> int:
        return len(self._bounds)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        start, end = self._bounds[index]
        return next_token_example(self._tokens[start:end])


def _pieces(
    tokenizer: Tokenizer | str | os.PathLike,
    files: Sequence[str] | None,
    split: str,
    seq_len: int,
    cache_dir: str | os.PathLike | None,
) -> grain.MapDataset:
    if not isinstance(tokenizer, Tokenizer):
        tokenizer = load_tokenizer(tokenizer)
    files = corpus_files(split) if files is None else list(files)
    corpus = tokenize_files(tokenizer, files, cache_dir=cache_dir)
    return grain.MapDataset.source(_Pieces(corpus, seq_len))


@gin.configurable("train_data")
def train_data(
    tokenizer: Tokenizer | str | os.PathLike,
    files: Sequence[str] | None = None,
    *,
    seq_len: int = 256,
    batch_size: int = 32,
    seed: int = 0,
    num_epochs: int | None = None,
    num_packing_bins: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    prefetch: int = 2,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.IterDataset:
    """Packed batches, reshuffled (deterministically from ``seed``) every epoch.

    The stream is infinite unless ``num_epochs`` is given.  ``files`` default to the shipped
    training corpus; ``tokenizer`` is a ``Tokenizer`` or a path to a ``tokenizer.json``.
    ``num_packing_bins`` defaults to ``4 * batch_size``.  With several hosts, host
    ``shard_index`` of ``shard_count`` reads a disjoint share of the pieces.  A background thread
    keeps ``prefetch`` batches ready (0 disables it).
    """
    pieces = _pieces(tokenizer, files, "train", seq_len, cache_dir)[shard_index::shard_count]
    examples = pieces.shuffle(seed).repeat(num_epochs).to_iter_dataset(_IN_MEMORY)
    batches = pack_batches(
        examples,
        seq_len=seq_len,
        batch_size=batch_size,
        seed=seed,
        num_packing_bins=num_packing_bins or 4 * batch_size,
    )
    if prefetch:
        batches = grain.experimental.ThreadPrefetchIterDataset(
            batches, prefetch_buffer_size=prefetch
        )
    return batches


@gin.configurable("heldout_data")
def heldout_data(
    tokenizer: Tokenizer | str | os.PathLike,
    files: Sequence[str] | None = None,
    *,
    seq_len: int = 256,
    batch_size: int = 32,
    num_packing_bins: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    shard_index: int = 0,
    shard_count: int = 1,
) -> grain.IterDataset:
    """One pass over the held-out documents in a fixed order; re-iterable for every evaluation.

    Every held-out target is in exactly one batch; the last batch is filled up with padding
    rows (``loss_mask`` 0) so all batches share one shape.  With several hosts, host
    ``shard_index`` packs its share of the pieces, and hosts whose shares pack into fewer batches
    than the largest end with all-padding batches: every host runs the same number of eval
    steps, as a collective eval step needs.  (Each host packs every share once here to count.)
    """
    pieces = _pieces(tokenizer, files, "heldout", seq_len, cache_dir)

    def packed(shard: int) -> grain.IterDataset:
        return pack_batches(
            pieces[shard::shard_count].to_iter_dataset(_IN_MEMORY),
            seq_len=seq_len,
            batch_size=batch_size,
            num_packing_bins=num_packing_bins or 4 * batch_size,
            shuffle_bins=False,
        )

    batches = packed(shard_index)
    if shard_count == 1:
        return batches
    counts = [sum(1 for _ in packed(shard)) for shard in range(shard_count)]
    padding = grain.MapDataset.source(
        [padding_batch(batch_size, seq_len)] * (max(counts) - counts[shard_index])
    ).to_iter_dataset()
    return grain.experimental.InterleaveIterDataset([batches, padding], cycle_length=1)  # chained
