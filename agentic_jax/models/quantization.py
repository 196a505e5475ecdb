"""Weight-only quantisation for inference: int8, int4 and NF4 weights the forward dequantises.

A projection weight ``W [*lead, in..., out...]`` (``lead``: the ``layers`` and ``expert`` axes it
is stacked on) is seen as a matrix ``[*lead, In, Out]`` and cut into groups of ``g`` consecutive
inputs per output unit (``g = In``: one scale per output channel).  Each group gets

- ``int8`` / ``int4``, symmetric: ``s = max|w| / q_max`` (``q_max`` = 127, 7) and codes
  ``q = clip(round(w / s), -q_max - 1, q_max)``; ``ŵ = s q``;
- asymmetric (``symmetric=False``, a zero point): ``s = (max(w, 0) − min(w, 0)) / (2^b − 1)``,
  ``z = round(−min(w, 0) / s)`` and ``q = clip(round(w / s) + z, 0, 2^b − 1)``; ``ŵ = s (q − z)``;

so round-to-nearest is within ``s / 2`` of every weight.  ``nf4`` is QLoRA's 4-bit NormalFloat
(Dettmers et al. 2023, arXiv:2305.14314): 16 values at quantiles of N(0, 1) scaled to [-1, 1]
(:data:`NF4`), one absmax per block of 64 inputs, each weight the nearest value of ``w / absmax``;
the absmax constants are double-quantised: their mean is subtracted and blocks of 256 of them
stored as 8-bit floats (``float8_e4m3fn``) with one float32 scale per block.

4-bit codes are packed two per ``uint8`` along the input axis (``jnp.int4`` is stored one byte per
value by XLA's CPU backend in jax 0.10, so it saves nothing there).  Bits per weight, scales
included: int8 per channel 8 + 32/In; int4 with ``g`` 4 + 32/g (+ 8/g asymmetric); nf4
4 + 8/64 + 32/(64·256) ≈ 4.127 (:func:`param_bytes` counts them).

A :class:`QuantizedWeight` is a pytree node whose leaves all keep the weight's lead axes first,
so it scans, slices and shards over layers like the array it replaces; the transformer's
``_dense`` (and the MoE and LM-head casts, through :meth:`QuantizedWeight.astype`) dequantise it
on the fly inside the jitted forward; with ``TransformerConfig.quantized_matmul="pallas"``,
``_dense`` multiplies by int8 / int4 weights through the Pallas kernel that reads their codes
(:meth:`QuantizedWeight.matmul`).  ``generate``, the serving engine and RL rollouts take
quantised parameters as they are.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.models.config import TransformerConfig
from pallas_kernels.dequant_matmul import dequant_matmul
from sharding.partition import is_logical_axes, path_str

FORMATS = ("int8", "int4", "nf4")
BITS = {"int8": 8, "int4": 4, "nf4": 4}
NF4_BLOCK = 64
NF4_DOUBLE_BLOCK = 256
_FP8 = jnp.float8_e4m3fn
_FP8_MAX = 448.0

# QLoRA's NormalFloat4 table (bitsandbytes' ``create_normal_map(offset=0.9677083)``): 8 positive
# and 7 negative quantiles of N(0, 1), and an exact 0, normalised by the largest.
NF4 = np.array(
    [
        -1.0,
        -0.6961928009986877,
        -0.5250730514526367,
        -0.39491748809814453,
        -0.28444138169288635,
        -0.18477343022823334,
        -0.09105003625154495,
        0.0,
        0.07958029955625534,
        0.16093020141124725,
        0.24611230194568634,
        0.33791524171829224,
        0.44070982933044434,
        0.5626170039176941,
        0.7229568362236023,
        1.0,
    ],
    np.float32,
)

# The projections quantize_params quantises (those the forward runs through ``_dense``, the MoE
# experts and the LM head); MLA's k_up / v_up enter einsums of their own and stay as they are.
PROJECTIONS = {
    "attn": ("q", "k", "v", "o", "q_a", "q_b", "kv_a"),
    "mlp": ("gate", "up", "down"),
    "moe": ("gate", "up", "down"),
    "shared": ("gate", "up", "down"),
}
_INPUT_DIMS = {"o": 2}  # the attention output's input is (heads, head_dim); the others' one axis


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """A quantised weight ``[*lead, *in_shape, *out_shape]`` (see the module docstring).

    ``codes``: int8 ``[*lead, In, Out]``, or two 4-bit codes per uint8 ``[*lead, In/2, Out]``;
    ``scales``: float32 ``[*lead, In/g, Out]`` (NF4: the double-quantised absmax, float8
    ``[*lead, n, 256]``, with ``scale_scales [*lead, n]`` and ``scale_offset [*lead]``);
    ``zeros``: the asymmetric formats' zero points, uint8 ``[*lead, In/g, Out]``, else None.
    """

    codes: jax.Array
    scales: jax.Array
    zeros: jax.Array | None = None
    scale_scales: jax.Array | None = None
    scale_offset: jax.Array | None = None
    fmt: str = dataclasses.field(default="int8", metadata=dict(static=True))
    group_size: int = dataclasses.field(default=0, metadata=dict(static=True))
    in_shape: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))
    out_shape: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))

    @property
    def lead_shape(self) -> tuple[int, ...]:
        return tuple(self.codes.shape[:-2])

    @property
    def shape(self) -> tuple[int, ...]:
        """The float weight's shape (with the lead axes this node has now: a layer's slice has none)."""
        return (*self.lead_shape, *self.in_shape, *self.out_shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def group_scales(self) -> jax.Array:
        """float32 ``[*lead, In/g, Out]``: each group's scale (NF4: its dequantised absmax)."""
        if self.fmt != "nf4":
            return self.scales
        lead, n_out = self.lead_shape, math.prod(self.out_shape)
        groups = math.prod(self.in_shape) // self.group_size
        flat = self.scales.astype(jnp.float32) * (self.scale_scales[..., None] / _FP8_MAX)
        flat = flat.reshape(*lead, -1)[..., : groups * n_out] + self.scale_offset[..., None]
        return flat.reshape(*lead, groups, n_out)

    def dequantize(self, dtype=jnp.float32) -> jax.Array:
        """The weight ``ŵ`` in ``dtype`` (computed in float32)."""
        codes = _unpack(self.codes) if BITS[self.fmt] == 4 else self.codes
        if self.fmt == "nf4":
            values = jnp.asarray(NF4)[codes]
        elif self.zeros is not None:
            values = codes.astype(jnp.float32) - _per_input(self.zeros, self.group_size)
        else:
            values = codes.astype(jnp.float32) - (8 if self.fmt == "int4" else 0)
        w = values * _per_input(self.group_scales(), self.group_size)
        return w.reshape(self.shape).astype(dtype)

    def astype(self, dtype) -> jax.Array:
        """The dequantised weight in ``dtype``: code that casts a weight (``w.astype(dtype)``, as
        the MoE layer and the LM head do) reads the float weight it stands for."""
        return self.dequantize(dtype)

    def matmul(self, x) -> jax.Array:
        """``x [..., *in_shape] @ ŵ`` -> ``[..., *out_shape]`` in x's dtype by the Pallas kernel
        that dequantises tiles of the packed codes (``pallas_kernels.dequant_matmul``: int8 and
        int4, one layer's weight; NF4 has no kernel).  Differentiable in x only."""
        if self.fmt == "nf4" or self.lead_shape:
            raise ValueError(
                f"QuantizedWeight.matmul takes one layer's int8 / int4 weight; got fmt={self.fmt!r}"
                f" with lead axes {self.lead_shape}"
            )
        n_in = len(self.in_shape)
        if x.shape[x.ndim - n_in :] != self.in_shape:
            raise ValueError(f"x {x.shape} must end with the weight's inputs {self.in_shape}")
        y = dequant_matmul(
            x.reshape(*x.shape[: x.ndim - n_in], -1),
            self.codes,
            self.scales,
            self.zeros,
            bits=BITS[self.fmt],
            group_size=self.group_size,
        )
        return y.reshape(*y.shape[:-1], *self.out_shape)


def is_quantized(x) -> bool:
    return isinstance(x, QuantizedWeight)


def _per_input(x, group_size: int):
    """``[*lead, In/g, Out]`` repeated to ``[*lead, In, Out]`` (each group's value on its rows)."""
    return jnp.repeat(x.astype(jnp.float32), group_size, axis=-2)


def _pack(codes):
    """uint8 ``[..., In/2, Out]`` from 4-bit codes ``[..., In, Out]`` (even rows low nibble)."""
    codes = codes.astype(jnp.uint8)
    return codes[..., 0::2, :] | (codes[..., 1::2, :] << 4)


def _unpack(packed):
    """int32 ``[..., In, Out]`` codes from :func:`_pack`'s bytes."""
    low, high = packed & 0xF, packed >> 4
    return (
        jnp.stack([low, high], axis=-2)
        .reshape(*packed.shape[:-2], -1, packed.shape[-1])
        .astype(jnp.int32)
    )


def _double_quantize(absmax):
    """QLoRA's double quantisation of ``absmax [*lead, G, Out]``: ``(float8 [*lead, n, 256],
    block scales [*lead, n], offsets [*lead])``, the mean-centred constants in blocks of 256."""
    lead = absmax.shape[:-2]
    flat = absmax.reshape(*lead, -1)
    offset = flat.mean(-1)
    centred = flat - offset[..., None]
    pad = -centred.shape[-1] % NF4_DOUBLE_BLOCK
    blocks = jnp.pad(centred, [(0, 0)] * len(lead) + [(0, pad)]).reshape(
        *lead, -1, NF4_DOUBLE_BLOCK
    )
    block_max = jnp.max(jnp.abs(blocks), axis=-1)
    block_max = jnp.where(block_max == 0, 1.0, block_max)
    return (blocks / block_max[..., None] * _FP8_MAX).astype(_FP8), block_max, offset


def quantize(
    w,
    fmt: str,
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    n_lead: int = 0,
    n_in: int = 1,
) -> QuantizedWeight:
    """``w [*lead, in..., out...]`` (``n_lead`` lead axes, ``n_in`` input axes) in ``fmt``
    (:data:`FORMATS`), by round-to-nearest in groups of ``group_size`` inputs (None: one group
    per output channel for int8, 128 for int4; NF4's blocks are 64), or of all of them when the
    weight has fewer.  ``symmetric=False`` adds
    zero points (int8, int4)."""
    if fmt not in FORMATS:
        raise ValueError(f"quantize: fmt={fmt!r}; expected one of {FORMATS}")
    if fmt == "nf4" and not symmetric:
        raise ValueError("quantize: nf4 is symmetric (absmax); symmetric=False needs int8/int4")
    w = jnp.asarray(w)
    if not jnp.issubdtype(w.dtype, jnp.floating):
        raise ValueError(f"quantize: the weight must be floating point; got {w.dtype}")
    if w.ndim < n_lead + n_in + 1:
        raise ValueError(
            f"quantize: a weight of shape {w.shape} has no output axis after {n_lead} lead and "
            f"{n_in} input axes"
        )
    lead, in_shape = w.shape[:n_lead], w.shape[n_lead : n_lead + n_in]
    out_shape = w.shape[n_lead + n_in :]
    n_input = math.prod(in_shape)
    default = {"int8": n_input, "int4": 128, "nf4": NF4_BLOCK}[fmt]
    g = min(default if group_size is None else group_size, n_input)
    if g <= 0 or n_input % g or (BITS[fmt] == 4 and n_input % 2):
        raise ValueError(
            f"quantize: group_size={g} must divide the weight's {n_input} inputs (an even "
            f"number for 4-bit formats); shape {w.shape}"
        )
    m = w.astype(jnp.float32).reshape(*lead, n_input // g, g, math.prod(out_shape))
    meta = dict(fmt=fmt, group_size=g, in_shape=tuple(in_shape), out_shape=tuple(out_shape))
    shape = (*lead, n_input, math.prod(out_shape))
    if fmt == "nf4":
        absmax = jnp.max(jnp.abs(m), axis=-2)
        safe = jnp.where(absmax == 0, 1.0, absmax)
        normed = m / safe[..., None, :]
        codes = jnp.argmin(jnp.abs(normed[..., None] - jnp.asarray(NF4)), axis=-1)
        scales, scale_scales, offset = _double_quantize(absmax)
        return QuantizedWeight(
            _pack(codes.reshape(shape)), scales, None, scale_scales, offset, **meta
        )
    levels = 2 ** BITS[fmt]
    if symmetric:
        q_max = levels // 2 - 1
        scale = jnp.max(jnp.abs(m), axis=-2) / q_max
        scale = jnp.where(scale == 0, 1.0, scale)
        codes = jnp.clip(jnp.round(m / scale[..., None, :]), -q_max - 1, q_max)
        zeros = None
    else:
        low, high = jnp.minimum(m.min(-2), 0), jnp.maximum(m.max(-2), 0)
        scale = (high - low) / (levels - 1)
        scale = jnp.where(scale == 0, 1.0, scale)
        zeros = jnp.clip(jnp.round(-low / scale), 0, levels - 1)
        codes = jnp.clip(jnp.round(m / scale[..., None, :]) + zeros[..., None, :], 0, levels - 1)
        zeros = zeros.astype(jnp.uint8)
    codes = codes.reshape(shape)
    if fmt == "int4":
        codes = _pack(codes + (0 if zeros is not None else levels // 2))
    else:
        codes = codes.astype(jnp.uint8 if zeros is not None else jnp.int8)
    return QuantizedWeight(codes, scale, zeros, **meta)


def projection_layout(path: tuple[str, ...]) -> tuple[int, int] | None:
    """``(n_lead, n_in)`` of the parameter at ``path`` if it is a projection (what quantize_params
    and pruning.prune_params compress; None otherwise): layer
    weights lead with ``layers``, routed experts also with ``expert``."""
    group, name = (path[-2] if len(path) > 1 else None), path[-1]
    if path[0] != "layers" or name not in PROJECTIONS.get(group, ()):
        return None
    return 1 + (group == "moe"), _INPUT_DIMS.get(name, 1)


@gin.configurable
def quantize_params(
    params,
    config: TransformerConfig,
    fmt: str = "int8",
    *,
    group_size: int | None = None,
    symmetric: bool = True,
    lm_head: bool = False,
):
    """The model's parameters with every projection weight (attention, MLP, routed and shared
    experts; not MLA's k_up / v_up, not routers, embeddings, norms or biases) replaced by a
    :class:`QuantizedWeight` (:func:`quantize` with ``fmt``, ``group_size``, ``symmetric``);
    ``lm_head`` also quantises the untied LM head.  LoRA adapters stay float."""
    if lm_head and config.tie_embeddings:
        raise ValueError("quantize_params: lm_head=True, but the LM head is the tied embedding")
    options = dict(group_size=group_size, symmetric=symmetric)

    def convert(path, w):
        keys = tuple(getattr(k, "key", None) for k in path)
        if keys == ("lm_head",):
            return quantize(w, fmt, **options) if lm_head else w
        layout = projection_layout(keys)
        if layout is None or is_quantized(w):
            return w
        return quantize(w, fmt, n_lead=layout[0], n_in=layout[1], **options)

    return jax.tree_util.tree_map_with_path(convert, params, is_leaf=is_quantized)


def quantized_param_axes(axes, params):
    """The logical-axes tree of ``params`` as :func:`quantize_params` left them: each quantised
    weight's codes keep its lead axes and the first name of its input and its output axes (the
    flattened ``[In, Out]``); scales and zero points shard like the codes' output axis."""

    def for_leaf(ax, w):
        if not is_quantized(w):
            return ax
        n_lead = len(w.lead_shape)
        n_in = len(w.in_shape)
        lead, first_in, first_out = ax[:n_lead], ax[n_lead], ax[n_lead + n_in]
        if w.fmt == "nf4":
            return QuantizedWeight(
                (*lead, first_in, first_out),
                (*lead, None, None),
                None,
                (*lead, None),
                lead,
                **_meta(w),
            )
        grouped = (*lead, None, first_out)
        zeros = None if w.zeros is None else grouped
        return QuantizedWeight((*lead, first_in, first_out), grouped, zeros, **_meta(w))

    return jax.tree.map(for_leaf, axes, params, is_leaf=is_logical_axes)


def _meta(w: QuantizedWeight) -> dict:
    return dict(fmt=w.fmt, group_size=w.group_size, in_shape=w.in_shape, out_shape=w.out_shape)


def param_bytes(params) -> int:
    """Bytes the parameter tree holds (codes, scales and zero points of quantised weights)."""
    return sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(params))


def quantization_spec(params) -> dict[str, dict]:
    """``{"layers/attn/q": {"fmt", "group_size", "symmetric", "n_lead", "n_in"}}``: the
    :func:`quantize` arguments of each quantised weight of ``params`` (what a saved model records
    beside its arrays, so that :func:`quantized_shapes` can rebuild the tree to restore into)."""
    return {
        path_str(path): dict(
            fmt=w.fmt,
            group_size=w.group_size,
            symmetric=w.zeros is None,
            n_lead=len(w.lead_shape),
            n_in=len(w.in_shape),
        )
        for path, w in jax.tree_util.tree_leaves_with_path(params, is_leaf=is_quantized)
        if is_quantized(w)
    }


def quantized_shapes(shapes, spec: dict[str, dict]):
    """The ``ShapeDtypeStruct`` tree of float parameters ``shapes`` with the weights named in
    ``spec`` (:func:`quantization_spec`) quantised as it says."""
    unknown = set(spec) - {path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(shapes)}
    if unknown:
        raise ValueError(f"quantised weights {sorted(unknown)} are not parameters of the model")

    def convert(path, s):
        options = spec.get(path_str(path))
        return s if options is None else jax.eval_shape(functools.partial(quantize, **options), s)

    return jax.tree_util.tree_map_with_path(convert, shapes)
