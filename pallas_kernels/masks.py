"""Which keys a query may see: the one mask rule shared by every attention implementation.

Queries are the last T of S positions (causal offset S - T), so query row i sits at absolute
position ``i + S - T``.  A key j is visible to query i when all of these hold:

* causal:          j <= pos(i)
* sliding window:  pos(i) - j < w        (the query and the w-1 keys before it; Mistral)
* segments:        q_segment_ids[i] == kv_segment_ids[j]
"""

from __future__ import annotations

import jax.numpy as jnp

# Large negative instead of -inf keeps exp() and its gradient finite on fully masked rows.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


def visible(q_pos, k_pos, *, causal: bool, sliding_window: int | None, q_seg=None, k_seg=None):
    """Boolean visibility for broadcastable query/key positions (and optional segment ids)."""
    ok = jnp.ones(jnp.broadcast_shapes(jnp.shape(q_pos), jnp.shape(k_pos)), bool)
    if causal:
        ok = ok & (k_pos <= q_pos)
    if sliding_window is not None:
        ok = ok & (q_pos - k_pos < sliding_window)
        if not causal:
            ok = ok & (k_pos - q_pos < sliding_window)
    if q_seg is not None:
        ok = ok & (q_seg == k_seg)
    return ok


def dense_mask(
    batch: int, t: int, s: int, *, causal: bool, sliding_window: int | None, segment_ids=None
):
    """The full ``[B, T, S]`` mask (the reference implementation materialises it)."""
    q_pos = jnp.arange(t)[:, None] + (s - t)
    k_pos = jnp.arange(s)[None, :]
    if segment_ids is None:
        m = visible(q_pos, k_pos, causal=causal, sliding_window=sliding_window)
        return jnp.broadcast_to(m, (batch, t, s))
    q_seg, k_seg = segment_ids
    return visible(
        q_pos[None],
        k_pos[None],
        causal=causal,
        sliding_window=sliding_window,
        q_seg=q_seg[:, :, None],
        k_seg=k_seg[:, None, :],
    )


# Block-level view of the same rule, for kernels that tile T and S.  Causality and the
# window only constrain the distance d = q_pos - k_pos to an interval [d_min, d_max]; a
# block pair is worth computing when its distances meet that interval, and needs no mask
# when all of them fall inside it.  Bounds are Python ints (or traced int32 scalars for
# block indices); ``None`` means unbounded.


def distance_bounds(*, causal: bool, sliding_window: int | None):
    """The interval ``[d_min, d_max]`` of visible ``q_pos - k_pos`` (``None`` = unbounded)."""
    d_max = None if sliding_window is None else sliding_window - 1
    if causal:
        return 0, d_max
    return (None if sliding_window is None else -(sliding_window - 1)), d_max


def block_visibility(q_first, q_last, k_first, k_last, *, causal: bool, sliding_window: int | None):
    """``(any_visible, all_visible)`` for queries [q_first, q_last] x keys [k_first, k_last].

    Segment ids and padding are not considered: callers mask those per element.
    """
    d_min, d_max = distance_bounds(causal=causal, sliding_window=sliding_window)
    any_ok, all_ok = True, True
    if d_min is not None:
        any_ok = any_ok & (q_last - k_first >= d_min)
        all_ok = all_ok & (q_first - k_last >= d_min)
    if d_max is not None:
        any_ok = any_ok & (q_first - k_last <= d_max)
        all_ok = all_ok & (q_last - k_first <= d_max)
    return any_ok, all_ok


def visible_block_span(
    first,
    last,
    *,
    other_is_key: bool,
    other_offset: int,
    block: int,
    num_blocks: int,
    causal: bool,
    sliding_window: int | None,
):
    """First and last block index of the other axis that positions [first, last] can see.

    ``other_is_key``: the span is of queries and we want key blocks (else the reverse).
    ``other_offset`` is the position of the other axis' row 0 (S - T for queries, 0 for keys).
    The result is clamped to ``[0, num_blocks - 1]``; kernels use it to point the pipeline
    at an already-fetched block while they skip invisible ones, so no DMA is wasted.
    """
    d_min, d_max = distance_bounds(causal=causal, sliding_window=sliding_window)
    if other_is_key:  # k = q - d
        lo = None if d_max is None else first - d_max
        hi = None if d_min is None else last - d_min
    else:  # q = k + d
        lo = None if d_min is None else first + d_min
        hi = None if d_max is None else last + d_max
    lo_block = 0 if lo is None else jnp.clip((lo - other_offset) // block, 0, num_blocks - 1)
    hi_block = (
        num_blocks - 1 if hi is None else jnp.clip((hi - other_offset) // block, 0, num_blocks - 1)
    )
    return lo_block, hi_block
