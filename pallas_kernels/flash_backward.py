"""Flash-attention backward kernels (FlashAttention-2, Dao 2023, Algorithm 2).

Nothing of size [T, S] was saved: each kernel recomputes a tile's probabilities from the
forward's log-sum-exp, ``p = exp(s - lse)``, and with ``delta = rowsum(dO * O)`` forms

    dV = p^T dO,   dP = dO V^T,   dS = p * (dP - delta) * cap'(s) * scale,
    dQ = dS K,     dK = dS^T Q,

where ``cap'(s) = 1 - (s / cap)^2`` is the soft-cap derivative.  The two gradients that
sum over different axes get separate kernels so that neither needs atomics:

* dQ: grid ``(B, N, T/bq, S/bk)``, sums over key tiles for one query tile;
* dK/dV: grid ``(B, K, S/bk, G, T/bq)``, sums over every query tile *and* every query head
  of the kv group, which is how GQA gradients reach the shared kv head without ever
  materialising repeated K/V.

Both skip tiles that causality or the window hide, like the forward kernel.
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
    clamp_q_block,
    dot_nn,
    dot_nt,
    dot_tn,
    head_tile_spec,
    on_visible_tiles,
    segment_specs,
    tile_logits,
)
from pallas_kernels.masks import MASK_VALUE


def _probs_and_dlogits(cfg: FlashConfig, q, k, v, do, lse, delta, mask):
    """Recomputed probabilities p and d(loss)/d(q k^T) for one tile (mask may be None)."""
    s = tile_logits(cfg, q, k)
    p = jnp.exp((s if mask is None else jnp.where(mask, s, MASK_VALUE)) - lse)
    ds = p * (dot_nt(do, v) - delta)
    if cfg.soft_cap is not None:
        ds = ds * (1.0 - jnp.square(s / cfg.soft_cap))
    return p, ds * cfg.scale


def _split_refs(refs, cfg: FlashConfig, num_outputs: int):
    """(q, k, v, do, lse, delta, q_seg, kv_seg), outputs and scratch from a flat ref list."""
    inputs, rest = refs[:6], refs[6:]
    segs = (None, None)
    if cfg.has_segments:
        segs, rest = rest[:2], rest[2:]
    return (*inputs, *segs), rest[:num_outputs], rest[num_outputs:]


def _dq_kernel(*refs, cfg: FlashConfig):
    (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qs_ref, ks_ref), (dq_ref,), (dq_scr,) = (
        _split_refs(refs, cfg, 1)
    )
    bq, bk = cfg.tiling.block_q_bwd, cfg.tiling.block_kv_bwd
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        dq_scr[...] = jnp.zeros(dq_scr.shape, jnp.float32)

    def body(mask):
        k = k_ref[...]
        _, ds = _probs_and_dlogits(
            cfg, q_ref[...], k, v_ref[...], do_ref[...], lse_ref[...], delta_ref[...], mask
        )
        dq_scr[...] += dot_nn(ds.astype(k.dtype), k)

    on_visible_tiles(cfg, i, j, bq, bk, qs_ref, ks_ref, body)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        dq_ref[...] = dq_scr[...].astype(dq_ref.dtype)


def _dkv_kernel(*refs, cfg: FlashConfig):
    (
        (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qs_ref, ks_ref),
        (dk_ref, dv_ref),
        (dk_scr, dv_scr),
    ) = _split_refs(refs, cfg, 2)
    bq, bk = cfg.tiling.block_q_bwd, cfg.tiling.block_kv_bwd
    j, g, i = pl.program_id(2), pl.program_id(3), pl.program_id(4)

    @pl.when((g == 0) & (i == 0))
    def _init():
        dk_scr[...] = jnp.zeros(dk_scr.shape, jnp.float32)
        dv_scr[...] = jnp.zeros(dv_scr.shape, jnp.float32)

    def body(mask):
        q, do = q_ref[...], do_ref[...]
        p, ds = _probs_and_dlogits(
            cfg, q, k_ref[...], v_ref[...], do, lse_ref[...], delta_ref[...], mask
        )
        dv_scr[...] += dot_tn(p.astype(do.dtype), do)
        dk_scr[...] += dot_tn(ds.astype(q.dtype), q)

    on_visible_tiles(cfg, i, j, bq, bk, qs_ref, ks_ref, body)

    @pl.when((g == pl.num_programs(3) - 1) & (i == pl.num_programs(4) - 1))
    def _finish():
        dk_ref[...] = dk_scr[...].astype(dk_ref.dtype)
        dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


@functools.partial(jax.jit, static_argnames="cfg")
def flash_backward(q, k, v, q_seg, kv_seg, o, lse, do, *, cfg: FlashConfig):
    """Kernel-layout gradients (dq, dk, dv) from the forward's residuals and dO."""
    b, n, tp, h = q.shape
    kh, sp = k.shape[1], k.shape[2]
    g = cfg.groups
    bq, bk = cfg.tiling.block_q_bwd, cfg.tiling.block_kv_bwd
    nq, nk = tp // bq, sp // bk
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    row_args = [q, k, v, do, lse, delta]
    seg_args = [q_seg, kv_seg] if cfg.has_segments else []

    # dQ: grid (b, n, i, j) over query tiles i and (innermost) key tiles j.
    def dq_kv(bi, ni, i, j):
        return bi, ni // g, clamp_kv_block(cfg, i, j, bq, bk, nk), 0

    def dq_rows(bi, ni, i, j):
        return bi, ni, i, 0

    dq_specs = [
        head_tile_spec((bq, h), dq_rows),
        head_tile_spec((bk, h), dq_kv),
        head_tile_spec((bk, h), dq_kv),
        head_tile_spec((bq, h), dq_rows),
        head_tile_spec((bq, 1), dq_rows),
        head_tile_spec((bq, 1), dq_rows),
    ]
    if cfg.has_segments:
        dq_specs += segment_specs(bq, bk, dq_rows, dq_kv)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg),
        grid=(b, n, nq, nk),
        in_specs=dq_specs,
        out_specs=head_tile_spec((bq, h), dq_rows),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        scratch_shapes=[pltpu.VMEM((bq, h), jnp.float32)],
        compiler_params=tpu_compiler_params(True, True, True, False),
        interpret=cfg.interpret,
        name="flash_attention_dq",
    )(*row_args, *seg_args)

    # dK/dV: grid (b, kv head, j, group member, i); the last two axes are reductions.
    def dkv_rows(bi, ki, j, gi, i):
        return bi, ki * g + gi, clamp_q_block(cfg, j, i, bq, bk, nq), 0

    def dkv_kv(bi, ki, j, gi, i):
        return bi, ki, j, 0

    dkv_specs = [
        head_tile_spec((bq, h), dkv_rows),
        head_tile_spec((bk, h), dkv_kv),
        head_tile_spec((bk, h), dkv_kv),
        head_tile_spec((bq, h), dkv_rows),
        head_tile_spec((bq, 1), dkv_rows),
        head_tile_spec((bq, 1), dkv_rows),
    ]
    if cfg.has_segments:
        dkv_specs += segment_specs(bq, bk, dkv_rows, dkv_kv)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, cfg=cfg),
        grid=(b, kh, nk, g, nq),
        in_specs=dkv_specs,
        out_specs=[head_tile_spec((bk, h), dkv_kv), head_tile_spec((bk, h), dkv_kv)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        scratch_shapes=[pltpu.VMEM((bk, h), jnp.float32), pltpu.VMEM((bk, h), jnp.float32)],
        compiler_params=tpu_compiler_params(True, True, True, False, False),
        interpret=cfg.interpret,
        name="flash_attention_dkv",
    )(*row_args, *seg_args)
    return dq, dk, dv
