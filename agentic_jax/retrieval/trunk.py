"""What the trained retrieval models share: text as token rows, pooling the trunk's hidden
states, and running a jitted function over many rows.

Every model here is ``{"trunk": transformer params, ...head}`` over the project's causal
transformer (``models.hidden_states``): rows are ``BOS text EOS`` right-padded with 0, and
padding never changes a real token's state (attention is causal), so a row encodes the same
alone or in any batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.data.tokenizer import Tokenizer

POOLINGS = ("mean", "last", "tokens")


def pad_rows(rows: Sequence[Sequence[int]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens, mask)`` int32 ``[N, length]``: each row right-padded with 0, longer rows cut."""
    tokens = np.zeros((len(rows), length), np.int32)
    for i, row in enumerate(rows):
        row = list(row)[:length]
        tokens[i, : len(row)] = row
    lengths = np.minimum([len(r) for r in rows], length) if len(rows) else np.zeros(0, int)
    return tokens, (np.arange(length) < lengths[:, None]).astype(np.int32)


def wrap(tokenizer: Tokenizer, ids: Sequence[int], length: int) -> list[int]:
    """``BOS ids EOS`` with ``ids`` cut so the row fits ``length`` tokens (the EOS is kept: a
    last-token pooling reads it)."""
    return [tokenizer.bos_id, *list(ids)[: max(length - 2, 0)], tokenizer.eos_id]


def text_rows(tokenizer: Tokenizer, texts: Sequence[str], length: int):
    """``(tokens, mask)`` of ``BOS text EOS`` rows (:func:`pad_rows`)."""
    ids = tokenizer.encode_batch(list(texts))
    return pad_rows([wrap(tokenizer, row, length) for row in ids], length)


def last_index(mask) -> jax.Array:
    """``[B]``: each row's last mask position (0 for an empty row)."""
    mask = jnp.asarray(mask) > 0
    return jnp.max(jnp.where(mask, jnp.arange(mask.shape[1]), 0), axis=1)


def pool(h, mask, pooling: str) -> jax.Array:
    """``[B, D]`` from hidden states ``h [B, L, D]``: the mean over the mask's tokens, or the last
    one's state (in a causal trunk the only token that has read the whole text); ``"tokens"``
    keeps ``[B, L, D]`` with padding zeroed (late interaction scores every token)."""
    mask = jnp.asarray(mask, h.dtype)
    if pooling == "mean":
        return jnp.sum(h * mask[..., None], axis=1) / jnp.maximum(mask.sum(1), 1.0)[:, None]
    if pooling == "last":
        return jnp.take_along_axis(h, last_index(mask)[:, None, None], axis=1)[:, 0]
    if pooling == "tokens":
        return h * mask[..., None]
    raise ValueError(f"pooling={pooling!r}; expected one of {POOLINGS}")


def map_rows(fn: Callable, arrays: Sequence[np.ndarray], size: int) -> np.ndarray:
    """``fn(*chunks)`` over every row of ``arrays`` in chunks of ``size`` rows, concatenated on
    the host.  The last chunk is padded with copies of the first rows (and the extra outputs
    dropped), so a jitted ``fn`` compiles once."""
    rows = len(arrays[0])
    out = [
        np.asarray(fn(*(a[np.arange(start, start + size) % rows] for a in arrays)))
        for start in range(0, rows, size)
    ]
    return np.concatenate(out)[:rows]
