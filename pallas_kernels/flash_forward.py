"""Flash-attention forward kernel (FlashAttention-2, Dao 2023, Algorithm 1).

Grid ``(B, N, T/bq, S/bk)``: each program owns one query tile of one head and walks the
key/value tiles of that head's kv group along the innermost, sequential grid axis, keeping
the online-softmax state (row max ``m``, row sum ``l``, unnormalised output ``acc``) in
VMEM scratch:

    m' = max(m, rowmax(s));  p = exp(s - m');  l' = e^(m - m') l + rowsum(p)
    acc' = e^(m - m') acc + p v

After the last tile ``o = acc / l`` and ``lse = m + log l`` is saved for the backward
pass, which recomputes probabilities from it instead of storing the [T, S] matrix.
GQA needs no repeated K/V: the key/value index map sends query head n to kv head n // G.
A row that sees no key at all keeps ``l = 0`` and yields zeros (and ``lse = +big``, which
makes its recomputed probabilities exactly zero in the backward pass).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from pallas_kernels.backend import tpu_compiler_params
from pallas_kernels.flash_blocks import (
    FlashConfig,
    clamp_kv_block,
    dot_nn,
    head_tile_spec,
    on_visible_tiles,
    segment_specs,
    tile_logits,
)
from pallas_kernels.masks import MASK_VALUE


def _forward_kernel(*refs, cfg: FlashConfig):
    if cfg.has_segments:
        q_ref, k_ref, v_ref, qs_ref, ks_ref, o_ref, lse_ref, m_scr, l_scr, acc_scr = refs
    else:
        q_ref, k_ref, v_ref, o_ref, lse_ref, m_scr, l_scr, acc_scr = refs
        qs_ref = ks_ref = None
    bq, bk = cfg.tiling.block_q, cfg.tiling.block_kv
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_scr[...] = jnp.full(m_scr.shape, MASK_VALUE, jnp.float32)
        l_scr[...] = jnp.zeros(l_scr.shape, jnp.float32)
        acc_scr[...] = jnp.zeros(acc_scr.shape, jnp.float32)

    def accumulate(mask):
        s = tile_logits(cfg, q_ref[...], k_ref[...])
        if mask is not None:
            s = jnp.where(mask, s, MASK_VALUE)
        m_prev = m_scr[...]
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
        p = jnp.exp(s - m_new)
        if mask is not None:  # rows with nothing visible yet have m_new = MASK_VALUE, p = 1
            p = jnp.where(mask, p, 0.0)
        alpha = jnp.exp(m_prev - m_new)
        m_scr[...] = m_new
        l_scr[...] = alpha * l_scr[...] + jnp.sum(p, axis=-1, keepdims=True)
        v = v_ref[...]
        acc_scr[...] = alpha * acc_scr[...] + dot_nn(p.astype(v.dtype), v)

    on_visible_tiles(cfg, i, j, bq, bk, qs_ref, ks_ref, accumulate)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        l = l_scr[...]
        empty = l == 0.0
        o_ref[...] = (acc_scr[...] / jnp.where(empty, 1.0, l)).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(empty, -MASK_VALUE, m_scr[...] + jnp.log(l))


@functools.partial(jax.jit, static_argnames="cfg")
def flash_forward(q, k, v, q_seg, kv_seg, *, cfg: FlashConfig):
    """Kernel-layout forward: q [B,N,Tp,H], k/v [B,K,Sp,H], q_seg [B,Tp,1], kv_seg [B,1,Sp]
    (or both None) -> (o [B,N,Tp,H], lse [B,N,Tp,1] f32)."""
    b, n, tp, h = q.shape
    sp = k.shape[2]
    bq, bk = cfg.tiling.block_q, cfg.tiling.block_kv
    nq, nk = tp // bq, sp // bk
    g = cfg.groups

    def rows(bi, ni, i, j):
        return bi, ni, i, 0

    def kv_tile(bi, ni, i, j):
        return bi, ni // g, clamp_kv_block(cfg, i, j, bq, bk, nk), 0

    in_specs = [
        head_tile_spec((bq, h), rows),
        head_tile_spec((bk, h), kv_tile),
        head_tile_spec((bk, h), kv_tile),
    ]
    args = [q, k, v]
    if cfg.has_segments:
        in_specs += segment_specs(bq, bk, rows, kv_tile)
        args += [q_seg, kv_seg]
    return pl.pallas_call(
        functools.partial(_forward_kernel, cfg=cfg),
        grid=(b, n, nq, nk),
        in_specs=in_specs,
        out_specs=[head_tile_spec((bq, h), rows), head_tile_spec((bq, 1), rows)],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, n, tp, 1), jnp.float32),
        ],
        scratch_shapes=[
            pltpu.VMEM((bq, 1), jnp.float32),
            pltpu.VMEM((bq, 1), jnp.float32),
            pltpu.VMEM((bq, h), jnp.float32),
        ],
        compiler_params=tpu_compiler_params(True, True, True, False),
        interpret=cfg.interpret,
        name="flash_attention_fwd",
    )(*args)
