"""Batches of variable-length prompts, padded on either side, and the stopping rule shared by decoders."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.decoding.sampling import SamplingArrays
from agentic_jax.inference.errors import RequestError

PADDING_SIDES = ("left", "right")


class PromptBatch(NamedTuple):
    """Prompts ``tokens[B, P]``; row ``b``'s tokens are ``tokens[b, start[b]:end[b]]``.

    Left padding has ``end == P``, right padding ``start == 0`` (see ``kv_cache.py``).
    """

    tokens: jax.Array
    start: jax.Array
    end: jax.Array

    @classmethod
    def from_lists(
        cls,
        prompts: Sequence[Sequence[int]],
        *,
        padding: str = "left",
        pad_id: int = 0,
        length: int | None = None,
    ) -> PromptBatch:
        """Pads token lists to a common ``length`` (default: the longest) on the ``padding`` side."""
        if padding not in PADDING_SIDES:
            raise ValueError(f"padding={padding!r}; expected one of {PADDING_SIDES}")
        lengths = np.array([len(p) for p in prompts], np.int32)
        if not len(prompts) or lengths.min() == 0:
            raise ValueError("every prompt needs at least one token")
        width = int(lengths.max()) if length is None else length
        if width < lengths.max():
            raise ValueError(f"a prompt of {lengths.max()} tokens does not fit length {width}")
        tokens = np.full((len(prompts), width), pad_id, np.int32)
        for row, prompt in enumerate(prompts):
            if padding == "left":
                tokens[row, width - len(prompt) :] = prompt
            else:
                tokens[row, : len(prompt)] = prompt
        start = width - lengths if padding == "left" else np.zeros_like(lengths)
        end = np.full_like(lengths, width) if padding == "left" else lengths
        return cls(jnp.asarray(tokens), jnp.asarray(start), jnp.asarray(end))

    @classmethod
    def from_array(cls, tokens) -> PromptBatch:
        """Unpadded prompts ``[B, P]``."""
        tokens = jnp.asarray(tokens, jnp.int32)
        if tokens.ndim != 2 or 0 in tokens.shape:
            raise ValueError(
                f"prompts must be a [batch, length] array with at least one row and "
                f"one token; got shape {tokens.shape}"
            )
        b, p = tokens.shape
        return cls(tokens, jnp.zeros((b,), jnp.int32), jnp.full((b,), p, jnp.int32))

    @property
    def real(self):
        """``[B, P]`` mask of prompt (non-padding) tokens."""
        idx = jnp.arange(self.tokens.shape[1])[None, :]
        return (idx >= self.start[:, None]) & (idx < self.end[:, None])

    def rows(self) -> list[list[int]]:
        """The unpadded prompts as lists."""
        tokens, start, end = (np.asarray(a) for a in self)
        return [tokens[b, start[b] : end[b]].tolist() for b in range(tokens.shape[0])]


def check_token_ids(rows, vocab_size: int) -> None:
    """Raises unless every id of the host sequences ``rows`` is in ``[0, vocab_size)``: the
    embedding lookup would silently clamp any other."""
    try:
        rows = [np.asarray(row, np.int64).ravel() for row in rows]
    except OverflowError:
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})") from None
    if any(row.size and (row.min() < 0 or row.max() >= vocab_size) for row in rows):
        raise RequestError(f"prompt token ids must be in [0, {vocab_size})")


def as_prompt_batch(
    prompts, *, padding: str = "left", pad_id: int = 0, vocab_size: int | None = None
) -> PromptBatch:
    """A ``PromptBatch`` from itself, an unpadded ``[B, P]`` array, or token lists.

    Host prompts (lists, numpy arrays) must hold ids in ``[0, vocab_size)``: the embedding lookup
    would silently clamp any other.  Device arrays are not checked, as that would wait for them.
    """
    if isinstance(prompts, PromptBatch):
        return prompts
    if vocab_size is not None and not isinstance(prompts, jax.Array):
        check_token_ids(prompts, vocab_size)
    if isinstance(prompts, (jax.Array, np.ndarray)):
        return PromptBatch.from_array(prompts)
    return PromptBatch.from_lists(prompts, padding=padding, pad_id=pad_id)


def is_stop(tokens, arrays: SamplingArrays, eos_id: int | None):
    """``[B]``: the token ends its sequence (EOS or one of the row's ``stop_token_ids``)."""
    stop = (tokens[:, None] == arrays.stop_token_ids).any(-1)
    return stop if eos_id is None else stop | (tokens == eos_id)
