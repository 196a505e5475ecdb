"""Pure-jnp attention: the oracle every kernel is tested against.

        o = softmax(cap(q k^T * sm_scale) + mask) v,   cap(x) = c * tanh(x / c)

with grouped-query attention (N query heads share K kv heads, N % K == 0) and fully masked
rows returning zeros.  Memory is O(B N T S): use it for tests and short sequences.
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp

from pallas_kernels.masks import MASK_VALUE, dense_mask


def check_attention_inputs(q, k, v, segment_ids=None, *, sliding_window=None, logits_soft_cap=None):
    """Validates the shapes and options shared by all attention implementations; returns
    (B, T, S, N, K, H)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError(
            f"q, k, v must be rank 4 [B,T,N,H]/[B,S,K,H]; got {q.shape}, {k.shape}, {v.shape}"
        )
    b, t, n, h = q.shape
    bk, s, kh, hk = k.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    if bk != b or hk != h:
        raise ValueError(f"k batch/head_dim {k.shape} do not match q {q.shape}")
    if n % kh:
        raise ValueError(f"query heads N={n} must be a multiple of kv heads K={kh}")
    if t > s:
        raise ValueError(f"query length T={t} exceeds key length S={s}")
    if segment_ids is not None:
        q_seg, k_seg = segment_ids
        if q_seg.shape != (b, t) or k_seg.shape != (b, s):
            raise ValueError(
                f"segment_ids must be ([B,T], [B,S]) = ({(b, t)}, {(b, s)}); "
                f"got ({q_seg.shape}, {k_seg.shape})"
            )
    # A window of 0 would hide every key (all-zero output), a cap of 0 divide by zero.
    if sliding_window is not None and (
        isinstance(sliding_window, bool)
        or sliding_window < 1
        or not isinstance(sliding_window, numbers.Integral)
    ):
        raise ValueError(f"sliding_window must be a positive int, got {sliding_window!r}")
    if logits_soft_cap is not None and not logits_soft_cap > 0:
        raise ValueError(f"logits_soft_cap must be positive, got {logits_soft_cap!r}")
    return b, t, s, n, kh, h


def soft_cap(x, cap):
    return x if cap is None else cap * jnp.tanh(x / cap)


def reference_attention(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    block_sizes=None,
    interpret=None,
):
    """Reference multi-head attention; ``block_sizes`` and ``interpret`` are accepted and ignored."""
    del block_sizes, interpret
    b, t, s, n, kh, h = check_attention_inputs(
        q, k, v, segment_ids, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )
    scale = h**-0.5 if sm_scale is None else sm_scale
    qg = q.reshape(b, t, kh, n // kh, h)
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    logits = soft_cap(logits, logits_soft_cap)
    mask = dense_mask(
        b, t, s, causal=causal, sliding_window=sliding_window, segment_ids=segment_ids
    )[:, None, None]
    logits = jnp.where(mask, logits, MASK_VALUE)
    probs = jax.nn.softmax(logits, axis=-1)
    probs = jnp.where(mask.any(-1, keepdims=True), probs, 0.0)
    out = jnp.einsum(
        "bkgts,bskh->btkgh", probs.astype(v.dtype), v, preferred_element_type=jnp.float32
    )
    return out.reshape(b, t, n, h).astype(q.dtype)
