"""Decode attention over a paged KV cache (the PagedAttention layout, Kwon et al. 2023).

The cache stores keys and values in fixed-size physical pages ``[num_pages, page_size,
K, H]``; sequence b owns the pages listed in ``block_tables[b]`` (in logical order) and its
first ``lengths[b]`` positions are valid.  Pages can sit anywhere, so sequences grow and
free memory page by page (continuous batching) without compaction.

Kernel: grid ``(B, max_pages)``.  The block table and the lengths are scalar-prefetched so
the key/value index maps can look up the physical page of logical page j before the
kernel body runs; steps past a sequence's last page are skipped and their index map points
back at the last valid page, so no DMA is issued for them.  Each step updates an online
softmax (as in FlashAttention) for all N query heads of the one decode token; heads of a
kv group read the same page (GQA without repeated K/V).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.backend import resolve_interpret, tpu_compiler_params
from pallas_kernels.flash_blocks import dot_nn, dot_nt
from pallas_kernels.masks import MASK_VALUE
from pallas_kernels.reference import reference_attention


def page_span(lengths_ref, b, page_size: int, sliding_window: int | None):
    """First and last logical page holding a key that the decode token of sequence b sees."""
    length = lengths_ref[b]
    last = jnp.maximum(length - 1, 0) // page_size
    if sliding_window is None:
        return 0, last
    return jnp.maximum(length - sliding_window, 0) // page_size, last


def _paged_kernel(
    tables_ref,
    lengths_ref,
    q_ref,
    k_ref,
    v_ref,
    o_ref,
    m_scr,
    l_scr,
    acc_scr,
    *,
    page_size: int,
    kv_heads: int,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
):
    b, j = pl.program_id(0), pl.program_id(1)
    length = lengths_ref[b]
    first, last = page_span(lengths_ref, b, page_size, sliding_window)

    @pl.when(j == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, MASK_VALUE, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    @pl.when((j >= first) & (j <= last) & (length > 0))
    def _accumulate():
        q = q_ref[...]  # [N, H]
        n = q.shape[0]
        g = n // kv_heads
        k, v = k_ref[...], v_ref[...]  # [page_size, K, H]
        s = jnp.concatenate([dot_nt(q[h * g : (h + 1) * g], k[:, h]) for h in range(kv_heads)])
        s = s * scale
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        pos = j * page_size + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        mask = pos < length
        if sliding_window is not None:
            mask = mask & (length - 1 - pos < sliding_window)
        s = jnp.where(mask, s, MASK_VALUE)
        m_prev = m_scr[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
        alpha = jnp.exp(m_prev - m_new)
        m_scr[...] = m_new
        l_scr[...] = alpha * l_scr[...] + jnp.sum(p, axis=-1, keepdims=True)
        pv = jnp.concatenate(
            [dot_nn(p[h * g : (h + 1) * g].astype(v.dtype), v[:, h]) for h in range(kv_heads)]
        )
        acc_scr[...] = alpha * acc_scr[...] + pv

    @pl.when(j == pl.num_programs(1) - 1)
    def _finish():
        l = l_scr[...]
        o_ref[...] = (acc_scr[...] / jnp.where(l == 0.0, 1.0, l)).astype(o_ref.dtype)


def check_paged_inputs(q, k_pages, v_pages, block_tables, lengths):
    if q.ndim != 3 or k_pages.ndim != 4 or k_pages.shape != v_pages.shape:
        raise ValueError(
            f"expected q [B,N,H] and k/v pages [P,page,K,H]; got {q.shape}, "
            f"{k_pages.shape}, {v_pages.shape}"
        )
    b, n, h = q.shape
    kv_heads = k_pages.shape[2]
    if k_pages.shape[3] != h or n % kv_heads:
        raise ValueError(f"q {q.shape} does not match pages {k_pages.shape} (N % K must be 0)")
    if block_tables.ndim != 2 or block_tables.shape[0] != b or lengths.shape != (b,):
        raise ValueError(
            f"block_tables must be [B, max_pages] and lengths [B] for B={b}; got "
            f"{block_tables.shape}, {lengths.shape}"
        )
    # Longer sequences would read their last page again: wrong, not an error, inside the kernel.
    # Checked where the lengths are concrete; under jit the caller owns the bound.
    capacity = block_tables.shape[1] * k_pages.shape[1]
    if not isinstance(lengths, jax.core.Tracer) and int(jnp.max(lengths, initial=0)) > capacity:
        raise ValueError(
            f"lengths {lengths} exceed the block table's capacity of {capacity} "
            f"tokens ({block_tables.shape[1]} pages of {k_pages.shape[1]})"
        )


def paged_attention(
    q,
    k_pages,
    v_pages,
    block_tables,
    lengths,
    *,
    sm_scale=None,
    logits_soft_cap=None,
    sliding_window=None,
    interpret: bool | None = None,
):
    """One decode step: q [B,N,H] attends to its sequence's first ``lengths[b]`` cached keys.

    k_pages, v_pages: [num_pages, page_size, K, H]; block_tables: int32 [B, max_pages]
    (entries past a sequence's length are ignored); lengths: int32 [B], at most
    ``max_pages * page_size``.  Returns [B,N,H];
    a sequence of length 0 gets zeros.  ``sliding_window=w``: only the last w keys count.
    """
    check_paged_inputs(q, k_pages, v_pages, block_tables, lengths)
    interpret = resolve_interpret(interpret, "paged_attention")
    b, n, h = q.shape
    _, page_size, kv_heads, _ = k_pages.shape
    max_pages = block_tables.shape[1]
    scale = float(h**-0.5 if sm_scale is None else sm_scale)

    def page_index(bi, j, tables_ref, lengths_ref):
        first, last = page_span(lengths_ref, bi, page_size, sliding_window)
        return tables_ref[bi, jnp.minimum(jnp.clip(j, first, last), max_pages - 1)], 0, 0, 0

    page_spec = pl.BlockSpec((pl.squeezed, page_size, kv_heads, h), page_index)
    token_spec = pl.BlockSpec((pl.squeezed, n, h), lambda bi, j, *_: (bi, 0, 0))
    kernel = functools.partial(
        _paged_kernel,
        page_size=page_size,
        kv_heads=kv_heads,
        scale=scale,
        soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        sliding_window=sliding_window,
    )
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=2,
            grid=(b, max_pages),
            in_specs=[token_spec, page_spec, page_spec],
            out_specs=token_spec,
            scratch_shapes=[
                pltpu.VMEM((n, 1), jnp.float32),
                pltpu.VMEM((n, 1), jnp.float32),
                pltpu.VMEM((n, h), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=tpu_compiler_params(True, False),
        interpret=interpret,
        name="paged_attention",
    )(block_tables.astype(jnp.int32), lengths.astype(jnp.int32), q, k_pages, v_pages)


def paged_attention_reference(
    q,
    k_pages,
    v_pages,
    block_tables,
    lengths,
    *,
    sm_scale=None,
    logits_soft_cap=None,
    sliding_window=None,
    interpret=None,
):
    """Gathers each sequence's pages into contiguous K/V and runs ``reference_attention``."""
    del interpret
    check_paged_inputs(q, k_pages, v_pages, block_tables, lengths)
    b = q.shape[0]
    _, _page_size, kv_heads, h = k_pages.shape

    def gather(pages):
        return pages[block_tables].reshape(b, -1, kv_heads, h)

    k, v = gather(k_pages), gather(v_pages)
    s = k.shape[1]
    # Rotate each sequence so its valid keys are the last ``length`` positions: the decode
    # token is then the reference's single (causal, last-position) query, the window counts
    # back from it, and segment ids hide the rotated-in padding.
    shift = (s - lengths)[:, None]
    idx = (jnp.arange(s)[None, :] - shift) % s
    k, v = (jnp.take_along_axis(x, idx[:, :, None, None], axis=1) for x in (k, v))
    segment_ids = (jnp.ones((b, 1), jnp.int32), (jnp.arange(s)[None, :] >= shift).astype(jnp.int32))
    return reference_attention(
        q[:, None],
        k,
        v,
        causal=True,
        segment_ids=segment_ids,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
    )[:, 0]
