"""Attention with one dispatch point for every implementation.

* ``xla``: :func:`pallas_kernels.reference_attention`, the dense oracle (memory O(T S)).
* ``xla_chunked``: FlashAttention (Dao et al. 2022; FA-2, Dao 2023) written in plain jnp: a scan
  over key/value chunks with an online softmax, and a custom VJP that saves only the output and the
  log-sum-exp and recomputes probabilities chunk by chunk, so memory is linear in sequence length in
  the forward *and* the backward pass.
* ``pallas``: the Pallas flash-attention kernel (``pallas_kernels.flash_attention``).
* ``cudnn``: the fused GPU path chosen by ``pallas_kernels``.
* ``ring``: ring attention over the ``sequence`` mesh axis (:func:`sharding.ring_attention`), for
  contexts split over devices; with no mesh, or a ``sequence`` axis of one device, the ring is
  that one device and this is the ``xla`` path.

Online softmax over chunks c with running max m, normaliser l and accumulator a:

    m' = max(m, max_j s_j),  l' = l e^{m - m'} + sum_j e^{s_j - m'},
    a' = a e^{m - m'} + sum_j e^{s_j - m'} v_j

and o = a / l, lse = m + log l.  The backward pass uses P = exp(s - lse),
dV = P^T dO, dS = P (dO V^T - rowsum(dO * O)), dQ = dS K, dK = dS^T Q.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import einops
import jax
import jax.numpy as jnp

import pallas_kernels
from pallas_kernels.masks import MASK_VALUE, dense_mask, visible
from pallas_kernels.reference import check_attention_inputs, soft_cap
from sharding.mesh import active_axis_size
from sharding.ring_attention import ring_attention


def attention(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    implementation="xla",
    chunk_size=128,
    layout="contiguous",
):
    """Attention ``q[B,T,N,H], k/v[B,S,K,H] -> o[B,T,N,H]`` by the named implementation.

    ``layout`` is the order of positions along T and S for ``ring`` (``zigzag``: as
    :func:`sharding.ring_attention.to_zigzag` leaves them, which balances causal work over the
    ring); every other implementation takes natural order.
    """
    if layout != "contiguous" and implementation != "ring":
        raise ValueError(
            f"layout={layout!r} is for the ring implementation, not {implementation!r}"
        )
    kwargs = dict(
        causal=causal,
        segment_ids=segment_ids,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
    )
    if implementation == "xla":
        return pallas_kernels.reference_attention(q, k, v, **kwargs)
    if implementation == "xla_chunked":
        return chunked_attention(q, k, v, chunk_size=chunk_size, **kwargs)
    if implementation == "pallas":
        return pallas_kernels.flash_attention(q, k, v, **kwargs)
    if implementation == "cudnn":
        return pallas_kernels.gpu_attention(q, k, v, **kwargs)
    if implementation == "ring":
        if active_axis_size("sequence") == 1:
            return pallas_kernels.reference_attention(q, k, v, **kwargs)
        return ring_attention(q, k, v, layout=layout, **kwargs)
    raise ValueError(
        f"attention implementation {implementation!r}; expected one of "
        "('xla', 'xla_chunked', 'pallas', 'cudnn', 'ring')"
    )


def max_attention_logits(
    q, k, *, causal=True, segment_ids=None, sliding_window=None, sm_scale=None
):
    """``[N]``: per query head, the largest pre-softmax logit ``sm_scale q . k`` over every visible
    (query, key) pair of the batch, outside the gradient.

    QK-Clip's statistic (MuonClip, Kimi K2, 2025): a head whose largest logit grows without
    bound saturates its softmax and destabilises training, and the fix rescales that head's
    query and key projections.  Kept apart from :func:`attention` so that every implementation
    (kernels included) is left as it is; the logits are recomputed densely like the ``xla``
    path's, ``O(B N T S)`` memory in the forward pass only.
    """
    b, t, s, n, kh, h = check_attention_inputs(q, k, k, segment_ids, sliding_window=sliding_window)
    scale = h**-0.5 if sm_scale is None else sm_scale
    qg, kg = jax.lax.stop_gradient((_group_heads(q, kh), k.astype(jnp.float32)))
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, kg) * scale
    mask = dense_mask(
        b, t, s, causal=causal, sliding_window=sliding_window, segment_ids=segment_ids
    )
    logits = jnp.where(mask[:, None, None], logits, -jnp.inf)
    return jnp.max(logits, axis=(0, 3, 4)).reshape(n)


def chunked_attention(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    chunk_size=128,
):
    """Memory-linear attention: online softmax over key/value chunks with a recomputing VJP."""
    b, t, s, _n, _kh, h = check_attention_inputs(
        q, k, v, segment_ids, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    scale = h**-0.5 if sm_scale is None else float(sm_scale)
    chunk = min(chunk_size, s)
    pad = (-s) % chunk
    if segment_ids is None:
        q_seg, k_seg = jnp.zeros((b, t), jnp.int32), jnp.zeros((b, s), jnp.int32)
    else:
        q_seg, k_seg = (x.astype(jnp.int32) for x in segment_ids)
    # Padded keys are hidden by position (k_pos >= S) in the mask, whatever their segment id.
    k_seg = jnp.pad(k_seg, ((0, 0), (0, pad)))
    k = jnp.pad(k, ((0, 0), (0, pad), (0, 0), (0, 0)))
    v = jnp.pad(v, ((0, 0), (0, pad), (0, 0), (0, 0)))
    static = _Static(causal, sliding_window, logits_soft_cap, scale, chunk, t, s)
    return _flash(static, q, k, v, q_seg, k_seg)


class _Static(NamedTuple):
    """Hashable static arguments of the custom VJP."""

    causal: bool
    window: int | None
    cap: float | None
    scale: float
    chunk: int
    t: int
    s: int


def _split_chunks(x, chunk):
    """[B, S, ...] -> [S / chunk, B, chunk, ...] for scanning."""
    return einops.rearrange(x, "b (n c) ... -> n b c ...", c=chunk)


def _group_heads(x, kv_heads: int):
    """[B, T, N, H] -> [B, T, K, G, H]: the G query heads that share each of the K kv heads."""
    return einops.rearrange(x.astype(jnp.float32), "b t (k g) h -> b t k g h", k=kv_heads)


def _chunk_scores(st: _Static, qg, k_c, q_seg, k_seg_c, idx):
    """Scaled, capped scores [B,K,G,T,C] of one key chunk and its visibility mask."""
    raw = jnp.einsum("btkgh,bckh->bkgtc", qg, k_c.astype(jnp.float32)) * st.scale
    capped = soft_cap(raw, st.cap)
    q_pos = jnp.arange(st.t)[:, None] + (st.s - st.t)
    k_pos = idx * st.chunk + jnp.arange(st.chunk)[None, :]
    mask = visible(
        q_pos[None],
        k_pos[None],
        causal=st.causal,
        sliding_window=st.window,
        q_seg=q_seg[:, :, None],
        k_seg=k_seg_c[:, None, :],
    ) & (k_pos < st.s)
    return capped, mask[:, None, None]


def _forward(st: _Static, q, k, v, q_seg, k_seg):
    b, t, n, h = q.shape
    kh = k.shape[2]
    qg = _group_heads(q, kh)

    def step(carry, xs):
        m, l, acc = carry
        idx, k_c, v_c, seg_c = xs
        scores, mask = _chunk_scores(st, qg, k_c, q_seg, seg_c, idx)
        scores = jnp.where(mask, scores, MASK_VALUE)
        m_new = jnp.maximum(m, scores.max(-1))
        p = jnp.exp(scores - m_new[..., None]) * mask
        corr = jnp.exp(m - m_new)
        l = l * corr + p.sum(-1)
        acc = acc * corr[..., None] + jnp.einsum("bkgtc,bckh->bkgth", p, v_c.astype(jnp.float32))
        return (m_new, l, acc), None

    init = (
        jnp.full((b, kh, n // kh, t), MASK_VALUE, jnp.float32),
        jnp.zeros((b, kh, n // kh, t), jnp.float32),
        jnp.zeros((b, kh, n // kh, t, h), jnp.float32),
    )
    num = k.shape[1] // st.chunk
    xs = (
        jnp.arange(num),
        _split_chunks(k, st.chunk),
        _split_chunks(v, st.chunk),
        _split_chunks(k_seg, st.chunk),
    )
    (m, l, acc), _ = jax.lax.scan(step, init, xs)
    seen = l > 0
    out = jnp.where(seen[..., None], acc / jnp.where(seen, l, 1.0)[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(jnp.where(seen, l, 1.0)), jnp.inf)
    out = einops.rearrange(out, "b k g t h -> b t (k g) h")
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st, q, k, v, q_seg, k_seg):
    return _forward(st, q, k, v, q_seg, k_seg)[0]


def _flash_fwd(st, q, k, v, q_seg, k_seg):
    out, lse = _forward(st, q, k, v, q_seg, k_seg)
    return out, (q, k, v, q_seg, k_seg, out, lse)


def _flash_bwd(st, residuals, d_out):
    q, k, v, q_seg, k_seg, out, lse = residuals
    kh = k.shape[2]
    qg, dog = _group_heads(q, kh), _group_heads(d_out, kh)
    delta = jnp.einsum("btkgh,btkgh->bkgt", dog, _group_heads(out, kh))

    def step(dq, xs):
        idx, k_c, v_c, seg_c = xs
        capped, mask = _chunk_scores(st, qg, k_c, q_seg, seg_c, idx)
        p = jnp.where(mask, jnp.exp(capped - lse[..., None]), 0.0)
        dv_c = jnp.einsum("bkgtc,btkgh->bckh", p, dog)
        dp = jnp.einsum("btkgh,bckh->bkgtc", dog, v_c.astype(jnp.float32))
        ds = p * (dp - delta[..., None])
        if st.cap is not None:
            ds = ds * (1.0 - jnp.square(capped / st.cap))
        ds = ds * st.scale
        dq = dq + jnp.einsum("bkgtc,bckh->btkgh", ds, k_c.astype(jnp.float32))
        dk_c = jnp.einsum("bkgtc,btkgh->bckh", ds, qg)
        return dq, (dk_c, dv_c)

    num = k.shape[1] // st.chunk
    xs = (
        jnp.arange(num),
        _split_chunks(k, st.chunk),
        _split_chunks(v, st.chunk),
        _split_chunks(k_seg, st.chunk),
    )
    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros_like(qg), xs)

    dk, dv = (einops.rearrange(x, "n b c k h -> b (n c) k h") for x in (dk, dv))
    return (
        einops.rearrange(dq, "b t k g h -> b t (k g) h").astype(q.dtype),
        dk.astype(k.dtype),
        dv.astype(v.dtype),
        None,
        None,
    )


_flash.defvjp(_flash_fwd, _flash_bwd)
