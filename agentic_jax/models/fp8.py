"""FP8 matmuls with fine-grained scaling, as DeepSeek-V3 trains (DeepSeek-AI 2024, arXiv:2412.19437,
section 3.3).

Operands are cut into tiles along the contraction dimension and each tile gets its own scale, so
an outlier costs precision only in its own tile:

* activations (the left operand, ``[M, K]``): ``1 x 128`` tiles, one row by 128 contiguous
  elements of the contraction dimension;
* weights (the right operand, ``[K, N]``): ``128 x 128`` blocks;
* gradients: ``1 x 128`` tiles along the contraction dimension of the product they enter.

A tile ``t`` of an fp8 ``dtype`` with largest finite value ``F`` (448 for e4m3, 57344 for
e5m2) is stored as ``q = fp8(clip(t s, -F, F))`` with ``s = F / amax`` (1 where the tile is all
zero), and read back as ``q / s``; in a normal number of the format the round-trip error is at
most ``|t| 2^-(m+1)`` (``m`` mantissa bits: ``2^-4`` for e4m3, ``2^-3`` for e5m2).
Dimensions that are not a multiple of 128 are padded with zeros to one, so the last tile along
them is shorter (zeros change no tile's amax).

*Current scaling* takes ``amax`` from the tensor being quantised (:func:`quantize`), which is
what the model's projections do (``TransformerConfig.matmul_precision="fp8"``). *Delayed
scaling* takes it from the largest of the last steps' amaxes, an :class:`AmaxHistory` the caller
keeps (:func:`quantize_delayed`); values beyond it saturate to ``±F``.

:func:`fp8_matmul` is ``x @ w`` with e4m3 operands in the forward pass and, through
``jax.custom_vjp``, the incoming gradient quantised to e5m2 in the backward pass: ``dx = g w^T``
(``g`` in ``1 x 128`` tiles along ``N``, ``w^T`` in ``128 x 128`` blocks) and ``dw = x^T g``
(both in tiles of 128 along ``M``, the tokens). Products accumulate in float32, and each
128-element slice of the contraction is scaled back before it is added (DeepSeek-V3's
promotion to float32 accumulators). On a GPU the slices are ``jax.lax.dot_general`` on the fp8
operands themselves; elsewhere the operands are dequantised to float32 and multiplied there
(the same quantisation, simulated).
"""

from __future__ import annotations

import functools
import math

import flax.struct
import jax
import jax.numpy as jnp

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2
TILE = 128
ACTIVATION_TILE = (1, TILE)
WEIGHT_TILE = (TILE, TILE)


def _tiles(x, tile):
    """``x [R, C]`` zero-padded and cut into ``[R / tr, tr, C / tc, tc]`` tiles."""
    if x.ndim != 2:
        raise ValueError(f"fp8 tiles cut a matrix [rows, cols]; got shape {x.shape}")
    (rows, cols), (tr, tc) = x.shape, tile
    x = jnp.pad(x, ((0, -rows % tr), (0, -cols % tc)))
    return x.reshape(x.shape[0] // tr, tr, x.shape[1] // tc, tc)


def _untile(t, shape):
    return t.reshape(t.shape[0] * t.shape[1], -1)[: shape[0], : shape[1]]


def _expand(scale, tile, shape):
    """Each tile's scale repeated over the tile's elements: ``[R, C]``."""
    full = jnp.repeat(jnp.repeat(scale, tile[0], axis=0), tile[1], axis=1)
    return full[: shape[0], : shape[1]]


def tile_amax(x, tile=ACTIVATION_TILE):
    """The largest magnitude in each ``tile`` of ``x [R, C]``: float32 ``[ceil(R/tr), ceil(C/tc)]``."""
    return jnp.max(jnp.abs(_tiles(x, tile).astype(jnp.float32)), axis=(1, 3))


def quantize(x, dtype, tile=ACTIVATION_TILE, amax=None):
    """``(q, scale)``: ``x [R, C]`` in fp8 ``dtype``, one float32 scale per ``tile``.

    ``q = fp8(clip(x s, -F, F))`` with ``s = F / amax`` per tile (1 for an all-zero tile). ``amax``
    defaults to the tiles' own (current scaling); a given one (delayed scaling) saturates what
    exceeds it.
    """
    if jnp.dtype(dtype) not in (jnp.dtype(E4M3), jnp.dtype(E5M2)):
        raise ValueError(f"fp8 quantize: dtype must be float8_e4m3fn or float8_e5m2, got {dtype}")
    fmax = float(jnp.finfo(dtype).max)
    amax = tile_amax(x, tile) if amax is None else amax
    scale = jnp.where(amax > 0, fmax / jnp.where(amax > 0, amax, 1.0), 1.0).astype(jnp.float32)
    scaled = _tiles(x, tile).astype(jnp.float32) * scale[:, None, :, None]
    q = jnp.clip(scaled, -fmax, fmax).astype(dtype)
    return _untile(q, x.shape), scale


def dequantize(q, scale, tile=ACTIVATION_TILE):
    """Float32 ``q / scale``, each tile by its own scale (the inverse of :func:`quantize`)."""
    return q.astype(jnp.float32) / _expand(scale, tile, q.shape)


@flax.struct.dataclass
class AmaxHistory:
    """Delayed scaling's state for one operand: the per-tile amaxes of the last ``length`` steps,
    newest first (``history [length, *tile grid]``). Not threaded through the model: a caller
    that wants delayed scaling keeps one per operand and passes it to :func:`quantize_delayed`.
    """

    history: jax.Array

    @classmethod
    def create(cls, length: int, grid) -> AmaxHistory:
        if length < 1:
            raise ValueError(f"AmaxHistory length must be >= 1, got {length}")
        return cls(jnp.zeros((length, *grid), jnp.float32))

    def amax(self, current):
        """The amax to scale by: the history's largest, or ``current`` where the history has
        seen only zeros (the first step)."""
        past = jnp.max(self.history, axis=0)
        return jnp.where(past > 0, past, current)

    def push(self, current) -> AmaxHistory:
        return self.replace(history=jnp.concatenate([current[None], self.history[:-1]]))


def quantize_delayed(x, dtype, history: AmaxHistory, tile=ACTIVATION_TILE):
    """``(q, scale, history)``: :func:`quantize` with the amax of ``history`` (delayed scaling),
    and the history with this step's amaxes pushed."""
    current = tile_amax(x, tile)
    if current.shape != history.history.shape[1:]:
        raise ValueError(
            f"AmaxHistory holds a tile grid of {history.history.shape[1:]}; "
            f"x {x.shape} in {tile} tiles has {current.shape}"
        )
    q, scale = quantize(x, dtype, tile, amax=history.amax(current))
    return q, scale, history.push(current)


def _product(a, a_dtype, b, b_dtype, b_tile, fp8_dot=None):
    """Float32 ``a [M, K] @ b [K, N]`` of ``a`` quantised to ``a_dtype`` in ``1 x 128`` tiles and
    ``b`` to ``b_dtype`` in ``b_tile`` (128 along ``K``), accumulated per 128-slice of ``K``.

    ``fp8_dot`` (default: on a GPU) multiplies the fp8 operands by ``dot_general`` and scales
    each slice's float32 partial product; otherwise the operands are dequantised first.
    """
    qa, sa = quantize(a, a_dtype, ACTIVATION_TILE)
    qb, sb = quantize(b, b_dtype, b_tile)
    if fp8_dot is None:
        fp8_dot = jax.default_backend() == "gpu"
    if not fp8_dot:
        return jnp.matmul(
            dequantize(qa, sa, ACTIVATION_TILE),
            dequantize(qb, sb, b_tile),
            precision=jax.lax.Precision.HIGHEST,
        )
    (m, k), n = a.shape, b.shape[1]
    slices = sa.shape[1]
    qa = jnp.pad(qa, ((0, 0), (0, -k % TILE))).reshape(m, slices, TILE)
    qb = jnp.pad(qb, ((0, -k % TILE), (0, 0))).reshape(slices, TILE, n)
    partial = jax.lax.dot_general(
        qa, qb, (((2,), (1,)), ((1,), (0,))), preferred_element_type=jnp.float32
    )  # [slices, M, N]
    sb = jnp.repeat(sb, b_tile[1], axis=1)[:, :n]
    return jnp.sum(partial / sa.T[:, :, None] / sb[:, None, :], axis=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def fp8_matmul(x, w, fp8_dot=None):
    """``x [M, K] @ w [K, N]`` in ``x``'s dtype through FP8: e4m3 operands forward, the gradient
    in e5m2 backward (see the module docstring)."""
    return _product(x, E4M3, w, E4M3, WEIGHT_TILE, fp8_dot).astype(x.dtype)


def _fp8_matmul_fwd(x, w, fp8_dot):
    return fp8_matmul(x, w, fp8_dot), (x, w)


def _fp8_matmul_bwd(fp8_dot, residuals, g):
    x, w = residuals
    dx = _product(g, E5M2, w.T, E4M3, WEIGHT_TILE, fp8_dot)
    dw = _product(x.T, E4M3, g, E5M2, (TILE, 1), fp8_dot)
    return dx.astype(x.dtype), dw.astype(w.dtype)


fp8_matmul.defvjp(_fp8_matmul_fwd, _fp8_matmul_bwd)


def _split(eq: str):
    """``(k, ok)``: how many trailing labels of ``x`` are contracted with the leading labels of
    ``w``, for an ``eq`` of the form ``free_x contract, contract free_w -> free_x free_w``."""
    inputs, out = eq.replace(" ", "").split("->")
    xs, ws = inputs.split(",")
    for k in range(1, min(len(xs), len(ws)) + 1):
        if xs[len(xs) - k :] == ws[:k] and out == xs[: len(xs) - k] + ws[k:]:
            return k
    raise ValueError(
        f"fp8 einsum {eq!r}: expected 'free_x contract, contract free_w -> free_x free_w' "
        "(a projection: x's trailing axes contracted with w's leading ones)"
    )


def fp8_einsum(eq: str, x, w, fp8_dot=None):
    """``jnp.einsum(eq, x, w)`` for a projection (``"btd,dnh->btnh"``, ``"btnh,nhd->btd"``) as one
    :func:`fp8_matmul` of ``x`` flattened to ``[tokens, contraction]`` and ``w`` to
    ``[contraction, outputs]``: the weight's 128 x 128 blocks are taken in that matrix."""
    k = _split(eq)
    free_x, contract = x.shape[: x.ndim - k], x.shape[x.ndim - k :]
    if w.shape[:k] != contract:
        raise ValueError(f"fp8 einsum {eq!r}: x {x.shape} and w {w.shape} disagree")
    y = fp8_matmul(
        x.reshape(math.prod(free_x), math.prod(contract)),
        w.reshape(math.prod(contract), -1),
        fp8_dot,
    )
    return y.reshape(*free_x, *w.shape[k:])
