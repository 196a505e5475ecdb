"""N-gram prompt-lookup drafting (Saxena 2023, *Prompt Lookup Decoding*; Yang et al. 2023, LLMA).

Agentic and retrieval-heavy outputs copy long spans from their context (tool results, code,
documents).  The drafter looks for the sequence's last ``n`` tokens earlier in the sequence and
proposes the ``gamma`` tokens that followed them — no draft model at all.  ``n`` runs from
``max_ngram`` down to 1 and the longest n-gram with a match wins; ``branches`` proposals come from
its most recent occurrences (a tree of drafts).  A row with no match proposes its last
token repeated.  The proposals are deterministic, so the verifier treats them as point masses.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def ngram_drafts(seq, start, length, *, max_ngram: int, gamma: int, branches: int):
    """Draft tokens ``[B, branches, gamma]`` for rows ``seq[b, start[b]:length[b]]``.

    ``seq[B, S]`` holds each row's tokens at slots ``[start, length)``; slots at or after
    ``length`` are ignored.
    """
    b, s = seq.shape
    j = jnp.arange(s)[None, :]
    last = jnp.take_along_axis(seq, (length - 1)[:, None], axis=1)
    best_pos = jnp.full((b, branches), -1)
    best_n = jnp.zeros((b,), jnp.int32)
    for n in range(max_ngram, 0, -1):
        # An occurrence at [j, j + n) followed by at least one token of the row: any but the suffix
        # itself, which it may overlap ("a a a" proposes "a" after the 2-gram "a a").
        match = (
            (j >= start[:, None])
            & (j + n < length[:, None])
            & (length[:, None] - n >= start[:, None])
        )
        for k in range(n):
            target = jnp.take_along_axis(seq, jnp.clip(length - n + k, 0, s - 1)[:, None], axis=1)
            match &= jnp.roll(seq, -k, axis=1) == target
        pos = jax.lax.top_k(jnp.where(match, j, -1), branches)[0]
        better = (best_pos[:, 0] < 0) & (pos[:, 0] >= 0)
        best_pos = jnp.where(better[:, None], pos, best_pos)
        best_n = jnp.where(better, n, best_n)
    # Branches without an occurrence of their own reuse the most recent one.
    best_pos = jnp.where(best_pos < 0, best_pos[:, :1], best_pos)
    follow = best_pos[:, :, None] + best_n[:, None, None] + jnp.arange(gamma)[None, None, :]
    tokens = jnp.take_along_axis(seq[:, None, :], jnp.clip(follow, 0, s - 1), axis=2)
    usable = (best_pos[:, :, None] >= 0) & (follow < length[:, None, None])
    return jnp.where(usable, tokens, last[:, :, None]).astype(jnp.int32)
