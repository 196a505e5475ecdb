"""Paged decode attention for NVIDIA GPUs (Pallas' Triton lowering), same contract as
``paged_attention`` (the PagedAttention layout, Kwon et al. 2023).

The Mosaic kernel scalar-prefetches the block table so its index maps can fetch pages;
Triton has no scalar prefetch, so here the kernel itself reads each physical page number
from the block table and loads that page's ``[page_size, H]`` keys and values of its kv
head straight out of the page pool.  Grid ``(B, K)``: one program per sequence and kv
head, looping over the pages that hold visible keys (``paged_attention``'s page span) with
an online softmax (as in FlashAttention) for the G query heads of the group at once, so GQA
reads every page once per kv head.  ``tl.dot`` needs every matmul dimension >= 16 and every
array a power-of-two shape: the G query rows are zero-padded to such a block (the padding
rows are computed and dropped), pages must hold a power of two >= 16 tokens, and a head
dimension that is not a power of two is zero-padded (which copies the pool: choose
power-of-two heads on GPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.backend import resolve_interpret
from pallas_kernels.flash_blocks import dot_nn, dot_nt
from pallas_kernels.flash_triton import padded_head_dim
from pallas_kernels.masks import MASK_VALUE
from pallas_kernels.paged_attention import check_paged_inputs, page_span
from pallas_kernels.reference import soft_cap as cap_logits


def _paged_kernel(
    q_ref,
    k_ref,
    v_ref,
    table_ref,
    length_ref,
    o_ref,
    *,
    scale: float,
    soft_cap: float | None,
    sliding_window: int | None,
):
    kv_head = pl.program_id(1)
    page_size = k_ref.shape[1]
    length = length_ref[0]
    q = q_ref[...]  # [G padded, H]

    def over_page(j, carry):
        acc, m_prev, l_prev = carry
        page = table_ref[j]
        k, v = k_ref[page, :, kv_head, :], v_ref[page, :, kv_head, :]  # [page_size, H]
        s = cap_logits(dot_nt(q, k) * scale, soft_cap)
        pos = j * page_size + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        mask = pos < length
        if sliding_window is not None:
            mask = mask & (length - 1 - pos < sliding_window)
        s = jnp.where(mask, s, MASK_VALUE)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.where(mask, jnp.exp(s - m_new), 0.0)
        alpha = jnp.exp(m_prev - m_new)
        acc = alpha * acc + dot_nn(p.astype(v.dtype), v)
        return acc, m_new, alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)

    first, last = page_span(length_ref, 0, page_size, sliding_window)
    rows = q.shape[0]
    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.full((rows, 1), MASK_VALUE, jnp.float32),
        jnp.zeros((rows, 1), jnp.float32),
    )
    # A sequence of length 0 visits no page and keeps l = 0: zeros.
    acc, _, l = jax.lax.fori_loop(first, jnp.where(length > 0, last + 1, first), over_page, init)
    o_ref[...] = (acc / jnp.where(l == 0.0, 1.0, l)).astype(o_ref.dtype)


def paged_attention_triton(
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
    """``paged_attention`` with the Triton kernel: q [B,N,H], pages [P, page_size, K, H],
    block_tables [B, max_pages], lengths [B] -> [B,N,H].  ``interpret=None`` compiles on a
    GPU and interprets on CPU."""
    check_paged_inputs(q, k_pages, v_pages, block_tables, lengths)
    interpret = resolve_interpret(interpret, "paged_attention_triton", "gpu")
    b, n, h = q.shape
    _, page_size, kv_heads, _ = k_pages.shape
    if page_size < 16 or page_size & (page_size - 1):
        raise ValueError(
            f"paged_attention_triton needs pages of a power of two >= 16 tokens; got {page_size}"
        )
    groups, max_pages = n // kv_heads, block_tables.shape[1]
    rows, hp = max(16, pl.next_power_of_2(groups)), padded_head_dim(h)
    q_rows = jnp.pad(
        q.reshape(b, kv_heads, groups, h), ((0, 0), (0, 0), (0, rows - groups), (0, hp - h))
    )
    k_pages, v_pages = (jnp.pad(x, ((0, 0),) * 3 + ((0, hp - h),)) for x in (k_pages, v_pages))
    pool = pl.BlockSpec(k_pages.shape, lambda bi, ki: (0, 0, 0, 0))
    group = pl.BlockSpec((None, None, rows, hp), lambda bi, ki: (bi, ki, 0, 0))
    kernel = functools.partial(
        _paged_kernel,
        scale=float(h**-0.5 if sm_scale is None else sm_scale),
        soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        sliding_window=sliding_window,
    )
    out = pl.pallas_call(
        kernel,
        grid=(b, kv_heads),
        in_specs=[
            group,
            pool,
            pool,
            pl.BlockSpec((None, max_pages), lambda bi, ki: (bi, 0)),
            pl.BlockSpec((None, 1), lambda bi, ki: (bi, 0)),
        ],
        out_specs=group,
        out_shape=jax.ShapeDtypeStruct(q_rows.shape, q.dtype),
        compiler_params=pltriton.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="paged_attention_triton",
    )(q_rows, k_pages, v_pages, block_tables.astype(jnp.int32), lengths.astype(jnp.int32)[:, None])
    return out[:, :, :groups, :h].reshape(b, n, h)
