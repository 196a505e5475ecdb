"""Fixed-shape byte strings in jnp: a ``Text`` is ``(bytes uint8 [size], length)``.

Tool-call parsing and verifiers search, strip and compare substrings of
decoded model output inside jit.  Everything is a comparison of windows
(``size x len(pattern)``), which is cheap for the few hundred bytes of a turn.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

WHITESPACE = b" \t\n\r"


class Text(NamedTuple):
    data: jax.Array  # uint8 [size]
    length: jax.Array  # int32 []: may exceed size when the source did not fit

    @classmethod
    def from_bytes(cls, value: bytes, size: int) -> Text:
        """A constant (host side), e.g. a target answer; raises if it does not fit."""
        if len(value) > size:
            raise ValueError(f"{value!r} is longer than {size} bytes")
        data = np.zeros((size,), np.uint8)
        data[: len(value)] = np.frombuffer(value, np.uint8)
        return cls(data, np.int32(len(value)))

    @property
    def fits(self) -> jax.Array:
        return self.length <= self.data.shape[0]


def matches_at(text: Text, pattern: bytes) -> jax.Array:
    """bool [size]: ``pattern`` occurs at each start position (entirely within ``text``).

    One shifted comparison per pattern byte (static slices, no gather), which XLA fuses and
    vectorises over a batch of episodes.
    """
    size, width = text.data.shape[0], len(pattern)
    padded = jnp.concatenate([text.data, jnp.zeros((width,), jnp.uint8)])
    hits = jnp.arange(size) + width <= jnp.minimum(text.length, size)
    for offset, byte in enumerate(pattern):
        hits &= padded[offset : offset + size] == byte
    return hits


def starts_with(text: Text, pattern: bytes, at) -> jax.Array:
    """``pattern`` occurs at position ``at`` (entirely within ``text``): one window, not a search."""
    size, width = text.data.shape[0], len(pattern)
    window = jax.lax.dynamic_slice(
        jnp.concatenate([text.data, jnp.zeros((width,), jnp.uint8)]),
        (jnp.clip(at, 0, size),),
        (width,),
    )
    expected = jnp.asarray(np.frombuffer(pattern, np.uint8))
    return (at >= 0) & (at + width <= jnp.minimum(text.length, size)) & jnp.all(window == expected)


def find(text: Text, pattern: bytes, start=0) -> jax.Array:
    """First start position ``>= start`` of ``pattern``, or -1."""
    hits = matches_at(text, pattern) & (jnp.arange(text.data.shape[0]) >= start)
    return jnp.where(jnp.any(hits), jnp.argmax(hits), -1)


def count(text: Text, pattern: bytes) -> jax.Array:
    return jnp.sum(matches_at(text, pattern))


def _blank(text: Text) -> jax.Array:
    return jnp.isin(text.data, jnp.asarray(np.frombuffer(WHITESPACE, np.uint8)))


def is_space(text: Text, start, end) -> jax.Array:
    """Every byte in ``[start, end)`` is ASCII whitespace (true for an empty range)."""
    index = jnp.arange(text.data.shape[0])
    return jnp.all(_blank(text) | (index < start) | (index >= end))


def strip(text: Text, start, end) -> tuple[jax.Array, jax.Array]:
    """``[start, end)`` without leading and trailing ASCII whitespace (``start == end`` if blank)."""
    index = jnp.arange(text.data.shape[0])
    inside = (index >= start) & (index < end) & ~_blank(text)
    first = jnp.where(jnp.any(inside), jnp.argmax(inside), start)
    last = jnp.where(jnp.any(inside), text.data.shape[0] - jnp.argmax(inside[::-1]), start)
    return first, last


def substring(text: Text, start, end, size: int) -> Text:
    """``text[start:end]`` moved to the front of a ``[size]`` buffer (length ``end - start``)."""
    index = jnp.arange(size)
    source = jnp.clip(start + index, 0, text.data.shape[0] - 1)
    length = jnp.maximum(end - start, 0)
    return Text(jnp.where(index < length, text.data[source], 0).astype(jnp.uint8), length)


def equals(a: Text, b: Text) -> jax.Array:
    """Same length and bytes; false whenever either did not fit its buffer."""
    size = min(a.data.shape[0], b.data.shape[0])
    same = jnp.all((a.data[:size] == b.data[:size]) | (jnp.arange(size) >= a.length))
    return (a.length == b.length) & (a.length <= size) & a.fits & b.fits & same


def embed(text: Text, dim: int) -> jax.Array:
    """Unit-norm counts of hashed, case-folded byte trigrams, float32 ``[dim]``.

    A retrieval key that needs no learned weights: the dot product of two
    embeddings measures shared character trigrams, so a query naming an
    entity scores the documents that mention it highest.
    """
    data = text.data.astype(jnp.uint32)
    data = jnp.where((data >= ord("A")) & (data <= ord("Z")), data + 32, data)
    size = data.shape[0]
    index = jnp.arange(size)
    grams = (
        data
        + (data[jnp.minimum(index + 1, size - 1)] << 8)
        + (data[jnp.minimum(index + 2, size - 1)] << 16)
    )
    buckets = (grams * jnp.uint32(2654435761)) % dim  # Knuth's multiplicative hash
    counts = (
        jnp.zeros((dim,), jnp.float32).at[buckets].add(index + 3 <= jnp.minimum(text.length, size))
    )
    return counts / jnp.maximum(jnp.linalg.norm(counts), 1e-6)


def contains(text: Text, pattern: Text) -> jax.Array:
    """``pattern`` (a traced string, e.g. a task's answer) occurs in ``text``; an empty pattern
    or one that did not fit its buffer never does.  One window comparison per pattern byte, as
    `matches_at`."""
    size, width = text.data.shape[0], pattern.data.shape[0]
    padded = jnp.concatenate([text.data, jnp.zeros((width,), jnp.uint8)])
    hits = jnp.arange(size) + pattern.length <= jnp.minimum(text.length, size)
    for offset in range(width):
        hits &= (padded[offset : offset + size] == pattern.data[offset]) | (
            offset >= pattern.length
        )
    return jnp.any(hits) & (pattern.length > 0) & pattern.fits
