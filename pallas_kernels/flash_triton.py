"""Flash-attention forward and backward kernels for NVIDIA GPUs (Pallas' Triton lowering).

The same algorithm as ``flash_forward`` / ``flash_backward`` (FlashAttention-2, Dao 2023,
Algorithms 1 and 2), laid out the way Triton wants it rather than the way Mosaic TPU does:

* every grid axis is parallel (Triton has no sequential grid axis and no scratch memory), so
  each program owns one output tile and walks the tiles it reduces over with an in-kernel
  ``fori_loop``, the running state (``m``, ``l``, ``acc``; or dQ; or dK and dV) living in
  registers as the loop carry;
* the loop runs only over the span of tiles the causal / window band lets the tile see
  (``masks.visible_block_span``), and builds the element mask only for tiles that need one
  (``flash_blocks.tile_flags``), so causal attention does half the work;
* the grid has at most three axes: (tile, batch, head);
* every array a kernel touches has power-of-two dimensions, at least 16 (``tl.dot``'s
  smallest tile): :func:`plan_triton_tiling` picks such tiles and the wrapper pads the head
  dimension to :func:`padded_head_dim`.

Forward, grid ``(T/bq, B, N)``: online softmax over the key tiles, saving ``o`` and the
log-sum-exp.  Backward, two kernels so that neither needs atomics: dQ, grid
``(T/bq, B, N)``, sums over key tiles; dK/dV, grid ``(S/bk, B, K)``, sums over the query
tiles of every query head of the kv group (GQA gradients reach the shared kv head without
repeated K/V).  Array layouts are those of the Mosaic kernels (head-major, ``lse`` and
``delta`` as ``[B, N, Tp, 1]``, segment ids as ``[B, Tp, 1]`` / ``[B, 1, Sp]``), so
``flash_attention`` swaps one kernel family for the other behind the same custom VJP.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from pallas_kernels import masks
from pallas_kernels.block_sizes import BlockSizes, Tiling
from pallas_kernels.flash_blocks import (
    FlashConfig,
    dot_nn,
    dot_nt,
    dot_tn,
    head_tile_spec,
    segment_specs,
    tile_flags,
    tile_logits,
    tile_mask,
)
from pallas_kernels.masks import MASK_VALUE

# Hopper-friendly defaults: a 128-row query tile keeps the forward's two matmuls on the
# tensor cores; the backward holds P, dP and dS for a tile at once, hence 64 x 64.
TRITON_BLOCK_SIZES = BlockSizes(block_q=128, block_kv=64, block_q_bwd=64, block_kv_bwd=64)
_MIN_TILE = 16  # tl.dot needs every matmul dimension >= 16


def padded_head_dim(head_dim: int) -> int:
    """The head dimension the kernels see: the next power of two, at least 16 (the wrapper
    zero-pads q, k, v to it, which changes no logit and no output column it keeps)."""
    return max(_MIN_TILE, pl.next_power_of_2(head_dim))


def _fit_tile(name: str, block: int, length: int) -> int:
    if block < _MIN_TILE or block & (block - 1):
        raise ValueError(
            f"BlockSizes.{name}={block} must be a power of two >= {_MIN_TILE} for the Triton "
            "kernels"
        )
    return min(block, max(_MIN_TILE, pl.next_power_of_2(length)))


def plan_triton_tiling(blocks: BlockSizes, q_len: int, kv_len: int) -> Tiling:
    """Power-of-two tiles shrunk to the sequence; lengths padded to the largest tile (every
    tile, a power of two, divides it)."""
    bq, bq_bwd = (_fit_tile(n, getattr(blocks, n), q_len) for n in ("block_q", "block_q_bwd"))
    bk, bk_bwd = (_fit_tile(n, getattr(blocks, n), kv_len) for n in ("block_kv", "block_kv_bwd"))
    q_unit, kv_unit = max(bq, bq_bwd), max(bk, bk_bwd)
    return Tiling(
        bq, bk, bq_bwd, bk_bwd, -(-q_len // q_unit) * q_unit, -(-kv_len // kv_unit) * kv_unit
    )


def _compiler_params(head_dim: int):
    """Warps per program: 4 up to head_dim 64, 8 beyond (more rows of the output tile in
    flight); two pipeline stages of the key/value loads."""
    return pltriton.CompilerParams(num_warps=4 if head_dim <= 64 else 8, num_stages=2)


def _span(cfg: FlashConfig, block, *, rows: int, other: int, num_other: int, of_keys: bool):
    """``[lo, hi]`` of the other axis' tiles that tile ``block`` of this axis can see."""
    first = block * rows + (cfg.kv_offset if of_keys else 0)
    return masks.visible_block_span(
        first,
        first + rows - 1,
        other_is_key=of_keys,
        other_offset=0 if of_keys else cfg.kv_offset,
        block=other,
        num_blocks=num_other,
        causal=cfg.causal,
        sliding_window=cfg.sliding_window,
    )


def _tile(ref, index, size: int, *lead):
    """Rows ``[index * size, (index + 1) * size)`` of ``ref[*lead]``, a [L, ...] ref."""
    return ref[(*lead, pl.ds(pl.multiple_of(index * size, size), size))]


def _step_on_tile(cfg: FlashConfig, i, j, bq: int, bk: int, q_seg, kv_seg_ref, step, carry):
    """``step(carry, mask)`` for query tile i x key tile j, with ``mask`` None when the tile
    is visible everywhere (the loop only visits tiles with something visible).

    Where ``tile_flags`` would answer with a constant, the choice is made here instead:
    Triton cannot lower a branch on a constant predicate, and there is nothing to decide.
    """

    def masked(carry):
        k_seg = kv_seg_ref[:, pl.ds(pl.multiple_of(j * bk, bk), bk)] if cfg.has_segments else None
        return step(carry, tile_mask(cfg, i, j, bq, bk, q_seg, k_seg))

    if cfg.has_segments:  # segment ids may hide any element of any tile
        return masked(carry)
    if not cfg.causal and cfg.sliding_window is None and not cfg.kv_is_padded:
        return step(carry, None)  # nothing is hidden anywhere
    _, needs_mask = tile_flags(cfg, i, j, bq, bk)
    return jax.lax.cond(needs_mask, masked, lambda carry: step(carry, None), carry)


def _split_refs(refs, cfg: FlashConfig, num_inputs: int):
    """Inputs, (q_seg, kv_seg) refs (or Nones) and outputs from a flat ref list."""
    inputs, rest = refs[:num_inputs], refs[num_inputs:]
    segs = (None, None)
    if cfg.has_segments:
        segs, rest = rest[:2], rest[2:]
    return inputs, segs, rest


def _forward_kernel(*refs, cfg: FlashConfig):
    (q_ref, k_ref, v_ref), (qs_ref, ks_ref), (o_ref, lse_ref) = _split_refs(refs, cfg, 3)
    bq, bk = cfg.tiling.block_q, cfg.tiling.block_kv
    i = pl.program_id(0)
    q = q_ref[...]
    q_seg = qs_ref[...] if cfg.has_segments else None

    def over_key_tile(j, carry):
        k, v = _tile(k_ref, j, bk), _tile(v_ref, j, bk)

        def step(carry, mask):
            acc, m_prev, l_prev = carry
            s = tile_logits(cfg, q, k)
            if mask is not None:
                s = jnp.where(mask, s, MASK_VALUE)
            m_new = jnp.maximum(m_prev, jnp.max(s, axis=-1, keepdims=True))
            p = jnp.exp(s - m_new)
            if mask is not None:  # rows with nothing visible yet have m_new = MASK_VALUE, p = 1
                p = jnp.where(mask, p, 0.0)
            alpha = jnp.exp(m_prev - m_new)
            acc = alpha * acc + dot_nn(p.astype(v.dtype), v)
            return acc, m_new, alpha * l_prev + jnp.sum(p, axis=-1, keepdims=True)

        return _step_on_tile(cfg, i, j, bq, bk, q_seg, ks_ref, step, carry)

    lo, hi = _span(cfg, i, rows=bq, other=bk, num_other=k_ref.shape[0] // bk, of_keys=True)
    init = (
        jnp.zeros(q.shape, jnp.float32),
        jnp.full((bq, 1), MASK_VALUE, jnp.float32),
        jnp.zeros((bq, 1), jnp.float32),
    )
    acc, m, l = jax.lax.fori_loop(lo, hi + 1, over_key_tile, init)
    empty = l == 0.0
    o_ref[...] = (acc / jnp.where(empty, 1.0, l)).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(empty, -MASK_VALUE, m + jnp.log(jnp.where(empty, 1.0, l)))


def _query_tile_maps(groups: int):
    """Index maps of a grid (query tile, b, query head): the tile's rows of that head, and the
    whole key/value sequence of its kv head (the kernel loops over its tiles)."""

    def rows(i, bi, ni):
        return bi, ni, i, 0

    def keys(i, bi, ni):
        return bi, ni // groups, 0, 0

    return rows, keys


@functools.partial(jax.jit, static_argnames="cfg")
def triton_forward(q, k, v, q_seg, kv_seg, *, cfg: FlashConfig):
    """Kernel-layout forward, as ``flash_forward``: q [B,N,Tp,H], k/v [B,K,Sp,H] ->
    (o [B,N,Tp,H], lse [B,N,Tp,1] f32)."""
    b, n, tp, h = q.shape
    sp = k.shape[2]
    bq = cfg.tiling.block_q
    rows, keys = _query_tile_maps(cfg.groups)
    in_specs = [
        head_tile_spec((bq, h), rows),
        head_tile_spec((sp, h), keys),
        head_tile_spec((sp, h), keys),
    ]
    args = [q, k, v]
    if cfg.has_segments:
        in_specs += segment_specs(bq, sp, rows, keys)
        args += [q_seg, kv_seg]
    return pl.pallas_call(
        functools.partial(_forward_kernel, cfg=cfg),
        grid=(tp // bq, b, n),
        in_specs=in_specs,
        out_specs=[head_tile_spec((bq, h), rows), head_tile_spec((bq, 1), rows)],
        out_shape=[
            jax.ShapeDtypeStruct(q.shape, q.dtype),
            jax.ShapeDtypeStruct((b, n, tp, 1), jnp.float32),
        ],
        compiler_params=_compiler_params(h),
        interpret=cfg.interpret,
        name="flash_attention_triton_fwd",
    )(*args)


def _dlogits(cfg: FlashConfig, s, p, do, v, delta):
    """d(loss)/d(q k^T * scale) from the capped logits s and probabilities p of a tile:
    ``p * (dO V^T - delta) * cap'(s) * scale`` (see ``flash_backward``)."""
    ds = p * (dot_nt(do, v) - delta)
    if cfg.soft_cap is not None:
        ds = ds * (1.0 - jnp.square(s / cfg.soft_cap))
    return ds * cfg.scale


def _probs(cfg: FlashConfig, q, k, lse, mask):
    """Capped logits and probabilities ``exp(s - lse)`` recomputed for one tile."""
    s = tile_logits(cfg, q, k)
    return s, jnp.exp((s if mask is None else jnp.where(mask, s, MASK_VALUE)) - lse)


def _dq_kernel(*refs, cfg: FlashConfig):
    (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref), (qs_ref, ks_ref), (dq_ref,) = _split_refs(
        refs, cfg, 6
    )
    bq, bk = cfg.tiling.block_q_bwd, cfg.tiling.block_kv_bwd
    i = pl.program_id(0)
    q, do, lse, delta = q_ref[...], do_ref[...], lse_ref[...], delta_ref[...]
    q_seg = qs_ref[...] if cfg.has_segments else None

    def over_key_tile(j, dq):
        k, v = _tile(k_ref, j, bk), _tile(v_ref, j, bk)

        def step(dq, mask):
            s, p = _probs(cfg, q, k, lse, mask)
            ds = _dlogits(cfg, s, p, do, v, delta)
            return dq + dot_nn(ds.astype(k.dtype), k)

        return _step_on_tile(cfg, i, j, bq, bk, q_seg, ks_ref, step, dq)

    lo, hi = _span(cfg, i, rows=bq, other=bk, num_other=k_ref.shape[0] // bk, of_keys=True)
    dq = jax.lax.fori_loop(lo, hi + 1, over_key_tile, jnp.zeros(q.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(*refs, cfg: FlashConfig):
    (
        (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref),
        (qs_ref, ks_ref),
        (dk_ref, dv_ref),
    ) = _split_refs(refs, cfg, 6)
    bq, bk = cfg.tiling.block_q_bwd, cfg.tiling.block_kv_bwd
    j = pl.program_id(0)
    k, v = k_ref[...], v_ref[...]
    num_q = q_ref.shape[1] // bq

    def over_query_tile(i, carry, member):
        q, do = _tile(q_ref, i, bq, member), _tile(do_ref, i, bq, member)
        lse, delta = _tile(lse_ref, i, bq, member), _tile(delta_ref, i, bq, member)
        q_seg = _tile(qs_ref, i, bq) if cfg.has_segments else None

        def step(carry, mask):
            dk, dv = carry
            s, p = _probs(cfg, q, k, lse, mask)
            ds = _dlogits(cfg, s, p, do, v, delta)
            return dk + dot_tn(ds.astype(q.dtype), q), dv + dot_tn(p.astype(do.dtype), do)

        return _step_on_tile(cfg, i, j, bq, bk, q_seg, ks_ref, step, carry)

    lo, hi = _span(cfg, j, rows=bk, other=bq, num_other=num_q, of_keys=False)

    def over_group_member(member, carry):
        return jax.lax.fori_loop(
            lo, hi + 1, functools.partial(over_query_tile, member=member), carry
        )

    zeros = jnp.zeros(k.shape, jnp.float32)
    dk, dv = jax.lax.fori_loop(0, cfg.groups, over_group_member, (zeros, zeros))
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


@functools.partial(jax.jit, static_argnames="cfg")
def triton_backward(q, k, v, q_seg, kv_seg, o, lse, do, *, cfg: FlashConfig):
    """Kernel-layout gradients (dq, dk, dv) from the forward's residuals and dO."""
    b, n, tp, h = q.shape
    kh, sp = k.shape[1], k.shape[2]
    g = cfg.groups
    bq, bk = cfg.tiling.block_q_bwd, cfg.tiling.block_kv_bwd
    delta = jnp.sum(o.astype(jnp.float32) * do.astype(jnp.float32), axis=-1, keepdims=True)
    args = [q, k, v, do, lse, delta] + ([q_seg, kv_seg] if cfg.has_segments else [])
    params = _compiler_params(h)

    # dQ: grid (query tile, b, n); the kernel loops over key tiles.
    dq_rows, dq_keys = _query_tile_maps(g)
    dq_specs = [
        head_tile_spec((bq, h), dq_rows),
        head_tile_spec((sp, h), dq_keys),
        head_tile_spec((sp, h), dq_keys),
        head_tile_spec((bq, h), dq_rows),
        head_tile_spec((bq, 1), dq_rows),
        head_tile_spec((bq, 1), dq_rows),
    ]
    if cfg.has_segments:
        dq_specs += segment_specs(bq, sp, dq_rows, dq_keys)
    dq = pl.pallas_call(
        functools.partial(_dq_kernel, cfg=cfg),
        grid=(tp // bq, b, n),
        in_specs=dq_specs,
        out_specs=head_tile_spec((bq, h), dq_rows),
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=params,
        interpret=cfg.interpret,
        name="flash_attention_triton_dq",
    )(*args)

    # dK/dV: grid (key tile, b, kv head); the kernel loops over the group's query heads and
    # their query tiles, so the query-side blocks hold all G heads of the group.
    def dkv_group(j, bi, ki):
        return bi, ki, 0, 0

    def dkv_keys(j, bi, ki):
        return bi, ki, j, 0

    def group_spec(cols):
        return pl.BlockSpec((pl.squeezed, g, tp, cols), dkv_group)

    dkv_specs = [
        group_spec(h),
        head_tile_spec((bk, h), dkv_keys),
        head_tile_spec((bk, h), dkv_keys),
        group_spec(h),
        group_spec(1),
        group_spec(1),
    ]
    if cfg.has_segments:
        dkv_specs += segment_specs(tp, sp, dkv_group, dkv_group)
    dk, dv = pl.pallas_call(
        functools.partial(_dkv_kernel, cfg=cfg),
        grid=(sp // bk, b, kh),
        in_specs=dkv_specs,
        out_specs=[head_tile_spec((bk, h), dkv_keys), head_tile_spec((bk, h), dkv_keys)],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=params,
        interpret=cfg.interpret,
        name="flash_attention_triton_dkv",
    )(*args)
    return dq, dk, dv
