"""The dequantising matmul's kernels: ``y = x @ ŵ`` and ``dx = g @ ŵ^T`` reading packed codes.

``ŵ = (q - z) s`` with ``s`` (and the zero point ``z``) constant over each group of input rows,
so a tile of codes that lies inside one group needs one ``[1, bn]`` row of scales, and the
scale can wait until after the matmul: ``x (q - z) s = (x (q - z)) s``.  The integer values
``q - z`` (in [-255, 255]) are exact in bf16, so the MXU / tensor cores multiply them exactly
and the float weight exists only as a tile in registers or VMEM, never in HBM.

4-bit codes hold input rows ``2r`` (low nibble) and ``2r + 1`` (high nibble) in byte row
``r``; the wrapper splits x into its even and odd columns (``parity`` 0 and 1), so

    x @ ŵ = x_even @ ŵ_low + x_odd @ ŵ_high

and a packed tile is used as it is, without interleaving.  8-bit codes have one parity.
Activations and input gradients are laid out ``[P, K/bk, M, bk]`` (parity, code-row tile,
row, column), so that every x tile is a whole trailing block (legal for Mosaic whatever bk).

Two families, as for flash attention: ``mosaic_*`` (grid with a sequential innermost
reduction axis, an f32 VMEM accumulator) and ``triton_*`` (every grid axis parallel, the
reduction an in-kernel ``fori_loop`` with the accumulator in registers).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from pallas_kernels.backend import tpu_compiler_params
from pallas_kernels.flash_blocks import dot_nn, dot_nt


@dataclasses.dataclass(frozen=True)
class DequantTiling:
    """Static description of one problem's kernels (hashable: it keys their traces).

    ``block_k`` counts rows of the codes array (byte rows for 4-bit codes) and divides
    ``group_rows``, the code rows of one quantisation group, so each step sees one group.
    """

    bits: int
    has_zeros: bool
    group_rows: int
    block_m: int
    block_n: int
    block_k: int
    interpret: bool

    @property
    def parities(self) -> int:
        return 2 if self.bits == 4 else 1

    @property
    def steps_per_group(self) -> int:
        return self.group_rows // self.block_k


def weight_values(codes, zeros, cfg: DequantTiling):
    """The integer values ``q - z`` of a code tile in f32, one ``[bk, bn]`` tile per parity;
    ``zeros`` is the group's ``[1, bn]`` zero-point row (None: symmetric, whose 4-bit codes
    carry an offset of 8 and 8-bit codes are signed)."""
    nibbles = (codes & 0xF, codes >> 4) if cfg.bits == 4 else (codes,)
    offset = 8.0 if cfg.bits == 4 else 0.0
    if zeros is not None:
        offset = zeros.astype(jnp.float32)
    return [n.astype(jnp.float32) - offset for n in nibbles]


def _forward_partial(x_tiles, codes, scales, zeros, cfg: DequantTiling):
    """``sum_p x_p (q_p - z) * s`` for one code tile: f32 ``[bm, bn]``."""
    values = weight_values(codes, zeros, cfg)
    acc = sum(dot_nn(x, v.astype(x.dtype)) for x, v in zip(x_tiles, values))
    return acc * scales.astype(jnp.float32)


def _backward_partials(g, codes, scales, zeros, cfg: DequantTiling):
    """``(g * s) (q_p - z)^T`` for one code tile: f32 ``[bm, bk]`` per parity."""
    gs = (g.astype(jnp.float32) * scales.astype(jnp.float32)).astype(g.dtype)
    return [dot_nt(gs, v.astype(g.dtype)) for v in weight_values(codes, zeros, cfg)]


def _mosaic_weight_specs(cfg: DequantTiling, tile):
    """BlockSpecs of the ``[bk, bn]`` code tile that ``tile(*grid) -> (code-row tile, column
    tile)`` names and of its group's ``[1, bn]`` scale row in a ``[G, 1, N]`` array."""

    def group_row(*grid):
        k, j = tile(*grid)
        return k // cfg.steps_per_group, 0, j

    return [
        pl.BlockSpec((cfg.block_k, cfg.block_n), tile),
        pl.BlockSpec((pl.squeezed, 1, cfg.block_n), group_row),
    ]


def _split_refs(refs, cfg: DequantTiling):
    """``(activation, codes, scales, zeros or None)`` refs and the rest (outputs, scratch)."""
    first, codes, scales, *rest = refs
    if cfg.has_zeros:
        return (first, codes, scales, rest[0]), rest[1:]
    return (first, codes, scales, None), rest


def _call(kernel, cfg: DequantTiling, operands, specs, **call_args):
    """``pallas_call`` of ``kernel`` on (activation, codes, scales[, zeros]) with their specs
    (the zero points take the scales' spec)."""
    if cfg.has_zeros:
        specs = [*specs, specs[-1]]
    else:
        operands = operands[:-1]
    return pl.pallas_call(
        functools.partial(kernel, cfg=cfg), in_specs=specs, interpret=cfg.interpret, **call_args
    )(*operands)


def _mosaic_call(kernel, cfg: DequantTiling, operands, specs, *, acc_shape, **call_args):
    """:func:`_call` on a grid whose last axis is the sequential reduction into an f32 VMEM
    accumulator of ``acc_shape``."""
    return _call(
        kernel,
        cfg,
        operands,
        specs,
        scratch_shapes=[pltpu.VMEM(acc_shape, jnp.float32)],
        compiler_params=tpu_compiler_params(True, True, False),
        **call_args,
    )


def _accumulate_over_last_grid_axis(acc_ref, out_ref, add):
    """Mosaic's reduction: zero ``acc_ref`` at the first step of the sequential grid axis,
    ``add()`` into it at every step, write it to ``out_ref`` at the last."""
    step = pl.program_id(2)

    @pl.when(step == 0)
    def _init():
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    add()

    @pl.when(step == pl.num_programs(2) - 1)
    def _finish():
        out_ref[...] = acc_ref[...].astype(out_ref.dtype)


def _mosaic_forward_kernel(*refs, cfg: DequantTiling):
    (x_ref, codes_ref, scales_ref, zeros_ref), (o_ref, acc_ref) = _split_refs(refs, cfg)

    def add():
        zeros = None if zeros_ref is None else zeros_ref[...]
        x_tiles = [x_ref[p] for p in range(cfg.parities)]
        acc_ref[...] += _forward_partial(x_tiles, codes_ref[...], scales_ref[...], zeros, cfg)

    _accumulate_over_last_grid_axis(acc_ref, o_ref, add)


@functools.partial(jax.jit, static_argnames="cfg")
def mosaic_forward(x_tiles, codes, scales, zeros, *, cfg: DequantTiling):
    """x_tiles ``[P, K/bk, Mp, bk]``, codes ``[K, N]``, scales (zeros) ``[G, 1, N]`` ->
    y ``[Mp, N]``; grid ``(Mp/bm, N/bn, K/bk)``, the last axis sequential."""
    p, num_k, mp, bk = x_tiles.shape
    n = codes.shape[1]
    bm, bn = cfg.block_m, cfg.block_n
    specs = [
        pl.BlockSpec((p, pl.squeezed, bm, bk), lambda i, j, k: (0, k, i, 0)),
        *_mosaic_weight_specs(cfg, lambda i, j, k: (k, j)),
    ]
    return _mosaic_call(
        _mosaic_forward_kernel,
        cfg,
        [x_tiles, codes, scales, zeros],
        specs,
        acc_shape=(bm, bn),
        grid=(mp // bm, n // bn, num_k),
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, k: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, n), x_tiles.dtype),
        name="dequant_matmul_fwd",
    )


def _mosaic_backward_kernel(*refs, cfg: DequantTiling):
    (g_ref, codes_ref, scales_ref, zeros_ref), (dx_ref, acc_ref) = _split_refs(refs, cfg)

    def add():
        zeros = None if zeros_ref is None else zeros_ref[...]
        partials = _backward_partials(g_ref[...], codes_ref[...], scales_ref[...], zeros, cfg)
        for p, partial in enumerate(partials):
            acc_ref[p] += partial

    _accumulate_over_last_grid_axis(acc_ref, dx_ref, add)


@functools.partial(jax.jit, static_argnames="cfg")
def mosaic_backward(g, codes, scales, zeros, *, cfg: DequantTiling):
    """g ``[Mp, N]`` -> dx in the x_tiles layout ``[P, K/bk, Mp, bk]``; grid
    ``(Mp/bm, K/bk, N/bn)``, the output-column axis sequential."""
    mp, n = g.shape
    bm, bn, bk, p = cfg.block_m, cfg.block_n, cfg.block_k, cfg.parities
    num_k = codes.shape[0] // bk
    specs = [
        pl.BlockSpec((bm, bn), lambda i, k, j: (i, j)),
        *_mosaic_weight_specs(cfg, lambda i, k, j: (k, j)),
    ]
    return _mosaic_call(
        _mosaic_backward_kernel,
        cfg,
        [g, codes, scales, zeros],
        specs,
        acc_shape=(p, bm, bk),
        grid=(mp // bm, num_k, n // bn),
        out_specs=pl.BlockSpec((p, pl.squeezed, bm, bk), lambda i, k, j: (0, k, i, 0)),
        out_shape=jax.ShapeDtypeStruct((p, num_k, mp, bk), g.dtype),
        name="dequant_matmul_dx",
    )


# Four warps per program and two pipeline stages of the code loads: untuned.
_TRITON_PARAMS = pltriton.CompilerParams(num_warps=4, num_stages=2)


def _triton_forward_kernel(*refs, cfg: DequantTiling):
    (x_ref, codes_ref, scales_ref, zeros_ref), (o_ref,) = _split_refs(refs, cfg)
    bk, spg = cfg.block_k, cfg.steps_per_group

    def over_code_tile(k, acc):
        codes = codes_ref[pl.ds(pl.multiple_of(k * bk, bk), bk), :]
        group = k // spg
        zeros = None if zeros_ref is None else zeros_ref[group]
        x_tiles = [x_ref[p, k] for p in range(cfg.parities)]
        return acc + _forward_partial(x_tiles, codes, scales_ref[group], zeros, cfg)

    num_k = x_ref.shape[1]
    acc = jax.lax.fori_loop(0, num_k, over_code_tile, jnp.zeros(o_ref.shape, jnp.float32))
    o_ref[...] = acc.astype(o_ref.dtype)


@functools.partial(jax.jit, static_argnames="cfg")
def triton_forward(x_tiles, codes, scales, zeros, *, cfg: DequantTiling):
    """As :func:`mosaic_forward`; grid ``(Mp/bm, N/bn)``, each program looping over K."""
    p, num_k, mp, bk = x_tiles.shape
    k_rows, n = codes.shape
    bm, bn = cfg.block_m, cfg.block_n
    specs = [
        pl.BlockSpec((p, num_k, bm, bk), lambda i, j: (0, 0, i, 0)),
        pl.BlockSpec((k_rows, bn), lambda i, j: (0, j)),
        pl.BlockSpec((scales.shape[0], 1, bn), lambda i, j: (0, 0, j)),
    ]
    return _call(
        _triton_forward_kernel,
        cfg,
        [x_tiles, codes, scales, zeros],
        specs,
        grid=(mp // bm, n // bn),
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        out_shape=jax.ShapeDtypeStruct((mp, n), x_tiles.dtype),
        compiler_params=_TRITON_PARAMS,
        name="dequant_matmul_triton_fwd",
    )


def _triton_backward_kernel(*refs, cfg: DequantTiling):
    (g_ref, codes_ref, scales_ref, zeros_ref), (dx_ref,) = _split_refs(refs, cfg)
    bn = cfg.block_n

    def over_column_tile(j, accs):
        cols = pl.ds(pl.multiple_of(j * bn, bn), bn)
        zeros = None if zeros_ref is None else zeros_ref[:, cols]
        partials = _backward_partials(
            g_ref[:, cols], codes_ref[:, cols], scales_ref[:, cols], zeros, cfg
        )
        return tuple(acc + partial for acc, partial in zip(accs, partials))

    init = tuple(jnp.zeros(dx_ref.shape[1:], jnp.float32) for _ in range(cfg.parities))
    accs = jax.lax.fori_loop(0, g_ref.shape[1] // bn, over_column_tile, init)
    for p, acc in enumerate(accs):
        dx_ref[p] = acc.astype(dx_ref.dtype)


@functools.partial(jax.jit, static_argnames="cfg")
def triton_backward(g, codes, scales, zeros, *, cfg: DequantTiling):
    """As :func:`mosaic_backward`; grid ``(Mp/bm, K/bk)``, each program looping over N."""
    mp, n = g.shape
    bm, bk, spg, p = cfg.block_m, cfg.block_k, cfg.steps_per_group, cfg.parities
    num_k = codes.shape[0] // bk
    specs = [
        pl.BlockSpec((bm, n), lambda i, k: (i, 0)),
        pl.BlockSpec((bk, n), lambda i, k: (k, 0)),
        pl.BlockSpec((pl.squeezed, 1, n), lambda i, k: (k // spg, 0, 0)),
    ]
    return _call(
        _triton_backward_kernel,
        cfg,
        [g, codes, scales, zeros],
        specs,
        grid=(mp // bm, num_k),
        out_specs=pl.BlockSpec((p, pl.squeezed, bm, bk), lambda i, k: (0, k, i, 0)),
        out_shape=jax.ShapeDtypeStruct((p, num_k, mp, bk), g.dtype),
        compiler_params=_TRITON_PARAMS,
        name="dequant_matmul_triton_dx",
    )
