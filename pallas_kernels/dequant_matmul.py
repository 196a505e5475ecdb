"""``y = x @ ŵ`` for weight-only quantised ``ŵ``, dequantising each weight tile in the kernel.

The storage is ``agentic_jax.models.quantization``'s (int8 and int4, symmetric or with zero
points): codes ``[K, N]`` (int8, symmetric), ``[K, N]`` uint8 (asymmetric int8) or two 4-bit
codes per uint8 ``[K/2, N]`` (even input rows in the low nibble, an offset of 8 when
symmetric); float32 scales and uint8 zero points ``[K/g, N]``, one per group of ``g`` inputs
and output column; ``ŵ = s (q - z)``.  A weight-only quantised matmul is memory-bound at
decode, where reading 4 or 8 bits per weight instead of 16 is the saving; XLA's dequantise
then einsum may write the float weight to HBM first, these kernels never do (the tile math
and layout are in ``dequant_matmul_kernels``; the same split as Marlin, Frantar et al. 2024,
and the W4A16 Triton kernels: dequantise in registers, scale per group, f32 accumulation).

Kernel families as for ``flash_attention``: ``mosaic_tpu`` and ``triton`` (NVIDIA GPUs);
None picks Triton on a GPU backend and Mosaic elsewhere; ``interpret=None`` compiles on the
family's platform and interprets on CPU.  Tiles: the reduction tile ``bk`` is a power of
two dividing the group's code rows (so each step needs one scale row), at least 16 for
Triton (``tl.dot``'s smallest) and 32 for Mosaic (the row tile of 8-bit arrays); the output
tile is a power of two dividing N (Triton: at least 16; Mosaic: at least 128, else all of
N), so the codes are never padded.  Rows of x are padded to the row tile.

Gradients (``jax.custom_vjp``): ``dx = g @ ŵ^T`` by a second kernel that also reads the
codes.  The weights are frozen: codes, scales and zero points get no gradient (zeros), as
for QLoRA's base; train adapters beside them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from pallas_kernels.backend import resolve_interpret, target_platform
from pallas_kernels.dequant_matmul_kernels import (
    DequantTiling,
    mosaic_backward,
    mosaic_forward,
    triton_backward,
    triton_forward,
)


class _Family(NamedTuple):
    forward: Callable
    backward: Callable
    platform: str  # where it compiles (elsewhere it only interprets)
    min_block_k: int
    min_block_n: int
    default_blocks: tuple[int, int, int]  # (block_m, block_n, block_k): untuned, speed unmeasured


_FAMILIES = {
    "mosaic_tpu": _Family(mosaic_forward, mosaic_backward, "tpu", 32, 128, (256, 512, 512)),
    "triton": _Family(triton_forward, triton_backward, "gpu", 16, 16, (64, 128, 64)),
}
KERNELS = tuple(_FAMILIES)
_MIN_BLOCK_M = 16  # tl.dot's smallest dimension; also a whole bf16 sublane tile on TPU


def check_quantized_inputs(x, codes, scales, zeros, *, bits: int, group_size: int) -> None:
    """Validates the storage layout against x ``[..., K]`` (see the module docstring)."""
    if bits not in (4, 8):
        raise ValueError(f"bits must be 4 or 8 (int4, int8); got {bits!r}")
    if x.ndim < 1 or codes.ndim != 2 or scales.ndim != 2:
        raise ValueError(
            f"expected x [..., K], codes [K or K/2, N] and scales [K/g, N]; got {x.shape}, "
            f"{codes.shape}, {scales.shape}"
        )
    k, n = x.shape[-1], codes.shape[1]
    if group_size <= 0 or k % group_size or (bits == 4 and group_size % 2):
        raise ValueError(
            f"group_size={group_size} must divide x's {k} inputs (and be even for int4, whose "
            "bytes must not straddle two groups)"
        )
    code_rows = k // 2 if bits == 4 else k
    if codes.shape[0] != code_rows:
        raise ValueError(
            f"codes {codes.shape} must be [{code_rows}, N] for {k} inputs of int{bits}"
        )
    want = jnp.int8 if bits == 8 and zeros is None else jnp.uint8
    if codes.dtype != want:
        raise ValueError(
            f"int{bits} {'symmetric' if zeros is None else 'asymmetric'} codes are {want.__name__};"
            f" got {codes.dtype}"
        )
    groups = (k // group_size, n)
    if scales.shape != groups or not jnp.issubdtype(scales.dtype, jnp.floating):
        raise ValueError(f"scales must be float {groups}; got {scales.dtype} {scales.shape}")
    if zeros is not None and (zeros.shape != groups or zeros.dtype != jnp.uint8):
        raise ValueError(f"zeros must be uint8 {groups}; got {zeros.dtype} {zeros.shape}")


def dequantize_codes(codes, scales, zeros, *, bits: int, group_size: int):
    """float32 ``ŵ [K, N]`` from the stored codes (the reference's dequantisation)."""
    if bits == 4:
        nibbles = jnp.stack([codes & 0xF, codes >> 4], axis=1)  # [K/2, 2, N]: rows 2r, 2r + 1
        values = nibbles.reshape(-1, codes.shape[1]).astype(jnp.float32)
    else:
        values = codes.astype(jnp.float32)
    if zeros is not None:
        values = values - jnp.repeat(zeros.astype(jnp.float32), group_size, axis=0)
    elif bits == 4:
        values = values - 8.0
    return values * jnp.repeat(scales.astype(jnp.float32), group_size, axis=0)


def dequant_matmul_reference(x, codes, scales, zeros=None, *, bits: int, group_size: int):
    """``x @ ŵ`` with the weight dequantised in float32 and materialised (the oracle)."""
    check_quantized_inputs(x, codes, scales, zeros, bits=bits, group_size=group_size)
    w = dequantize_codes(codes, scales, zeros, bits=bits, group_size=group_size)
    y = jnp.einsum("...k,kn->...n", x.astype(jnp.float32), w, precision=jax.lax.Precision.HIGHEST)
    return y.astype(x.dtype)


def _largest_power_of_two_tile(block: int, length: int) -> int:
    """The largest power of two <= ``block`` that divides ``length`` (1 if none larger)."""
    tile = 1
    while tile * 2 <= block and length % (tile * 2) == 0:
        tile *= 2
    return tile


def plan_dequant_tiling(
    kernels: str,
    *,
    rows: int,
    k: int,
    n: int,
    bits: int,
    group_size: int,
    has_zeros: bool,
    interpret: bool,
    block_sizes: tuple[int, int, int] | None = None,
) -> DequantTiling:
    """Tiles for an x of ``rows`` rows times a ``[k, n]`` weight; refuses what the family
    cannot tile without padding the codes (see the module docstring)."""
    family = _FAMILIES[kernels]
    min_k, min_n = family.min_block_k, family.min_block_n
    block_m, block_n, block_k = block_sizes or family.default_blocks
    if block_m < _MIN_BLOCK_M or block_m & (block_m - 1):
        raise ValueError(f"block_m={block_m} must be a power of two >= {_MIN_BLOCK_M}")
    group_rows = group_size // 2 if bits == 4 else group_size
    bk = _largest_power_of_two_tile(block_k, group_rows)
    if bk < min_k:
        raise ValueError(
            f"dequant_matmul ({kernels}): group_size={group_size} of int{bits} gives groups of "
            f"{group_rows} code rows with no power-of-two tile of at least {min_k} rows (<= "
            f"block_k={block_k}) dividing them; use group_size a multiple of "
            f"{min_k * (2 if bits == 4 else 1)}"
        )
    bn = _largest_power_of_two_tile(block_n, n)
    if bn < min_n:
        if kernels == "triton":
            raise ValueError(
                f"dequant_matmul (triton): the {n} output columns have no power-of-two tile of "
                f"at least {min_n} (<= block_n={block_n}) dividing them"
            )
        bn = n  # Mosaic takes a block spanning the whole axis
    bm = min(block_m, max(_MIN_BLOCK_M, pl.next_power_of_2(rows)))
    return DequantTiling(bits, has_zeros, group_rows, bm, bn, bk, interpret)


def _to_tiles(x, cfg: DequantTiling):
    """``[Mp, K]`` -> ``[P, K/(P bk), Mp, bk]``: parity-split, code-row-tiled columns."""
    mp, k = x.shape
    p = cfg.parities
    return x.reshape(mp, k // (p * cfg.block_k), cfg.block_k, p).transpose(3, 1, 0, 2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _dequant_matmul_core(x_tiles, codes, scales, zeros, cfg: DequantTiling, kernels: str):
    return _FAMILIES[kernels].forward(x_tiles, codes, scales, zeros, cfg=cfg)


def _core_fwd(x_tiles, codes, scales, zeros, cfg, kernels):
    y = _FAMILIES[kernels].forward(x_tiles, codes, scales, zeros, cfg=cfg)
    return y, (codes, scales, zeros)


def _core_bwd(cfg, kernels, residuals, g):
    codes, scales, zeros = residuals
    dx_tiles = _FAMILIES[kernels].backward(g, codes, scales, zeros, cfg=cfg)
    return dx_tiles, None, None, None  # frozen weights: no gradient


_dequant_matmul_core.defvjp(_core_fwd, _core_bwd)


def dequant_matmul(
    x,
    codes,
    scales,
    zeros=None,
    *,
    bits: int,
    group_size: int,
    block_sizes: tuple[int, int, int] | None = None,
    interpret: bool | None = None,
    kernels: str | None = None,
):
    """``x [..., K] @ ŵ [K, N]`` -> ``[..., N]`` in x's dtype (f32 or bf16; f32 accumulation),
    with the semantics of :func:`dequant_matmul_reference` and the storage of the module
    docstring.  ``block_sizes``: ``(block_m, block_n, block_k)`` upper bounds (``block_k`` in
    code rows); ``kernels``: ``"mosaic_tpu"`` or ``"triton"``.  Differentiable in ``x`` only.
    """
    check_quantized_inputs(x, codes, scales, zeros, bits=bits, group_size=group_size)
    if kernels is None:
        kernels = "triton" if target_platform() == "gpu" else "mosaic_tpu"
    if kernels not in _FAMILIES:
        raise ValueError(f"kernels must be one of {KERNELS}; got {kernels!r}")
    interpret = resolve_interpret(
        interpret, f"dequant_matmul ({kernels})", compiles_for=_FAMILIES[kernels].platform
    )
    lead, (k, n) = x.shape[:-1], (x.shape[-1], codes.shape[1])
    rows = x.size // k
    cfg = plan_dequant_tiling(
        kernels,
        rows=rows,
        k=k,
        n=n,
        bits=bits,
        group_size=group_size,
        has_zeros=zeros is not None,
        interpret=interpret,
        block_sizes=block_sizes,
    )
    padded = -(-rows // cfg.block_m) * cfg.block_m
    x2 = jnp.pad(x.reshape(rows, k), ((0, padded - rows), (0, 0)))
    group_rows = functools.partial(jnp.expand_dims, axis=1)  # [G, N] -> [G, 1, N]
    y = _dequant_matmul_core(
        _to_tiles(x2, cfg),
        codes,
        group_rows(scales),
        None if zeros is None else group_rows(zeros),
        cfg,
        kernels,
    )
    return y[:rows].reshape(*lead, n)
