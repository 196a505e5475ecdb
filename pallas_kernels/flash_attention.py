"""Public flash attention: layout, padding and the custom VJP around the Pallas kernels.

The kernels work head-major (``[B, N, T, H]``) so that a tile's last two dimensions are
(sequence, head_dim), the layout Mosaic TPU tiles natively; this wrapper transposes,
pads T and S to whole tiles, and differentiates through both (XLA handles those), while
the attention core carries a custom VJP: the forward saves only O and the log-sum-exp, and
the backward kernels recompute probabilities, so memory stays O(B N T H) instead of
O(B N T S).

Two kernel families share this wrapper and its array layouts: ``mosaic_tpu``
(``flash_forward`` / ``flash_backward``) and ``triton`` (``flash_triton``, for NVIDIA GPUs;
it also pads the head dimension to a power of two).  A GPU backend gets the Triton family,
any other backend the Mosaic one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from pallas_kernels.backend import resolve_interpret, target_platform
from pallas_kernels.block_sizes import BlockSizes, plan_tiling
from pallas_kernels.flash_backward import flash_backward
from pallas_kernels.flash_blocks import FlashConfig
from pallas_kernels.flash_forward import flash_forward
from pallas_kernels.flash_triton import (
    TRITON_BLOCK_SIZES,
    padded_head_dim,
    plan_triton_tiling,
    triton_backward,
    triton_forward,
)
from pallas_kernels.reference import check_attention_inputs


class KernelFamily(NamedTuple):
    platform: str  # where it compiles (elsewhere it only interprets)
    forward: Callable
    backward: Callable


KERNELS = {
    "mosaic_tpu": KernelFamily("tpu", flash_forward, flash_backward),
    "triton": KernelFamily("gpu", triton_forward, triton_backward),
}


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _attention_core(q, k, v, q_seg, kv_seg, cfg: FlashConfig, kernels: str):
    return KERNELS[kernels].forward(q, k, v, q_seg, kv_seg, cfg=cfg)[0]


def _attention_core_fwd(q, k, v, q_seg, kv_seg, cfg, kernels):
    o, lse = KERNELS[kernels].forward(q, k, v, q_seg, kv_seg, cfg=cfg)
    return o, (q, k, v, q_seg, kv_seg, o, lse)


def _attention_core_bwd(cfg, kernels, residuals, do):
    q, k, v, q_seg, kv_seg, o, lse = residuals
    dq, dk, dv = KERNELS[kernels].backward(q, k, v, q_seg, kv_seg, o, lse, do, cfg=cfg)
    return dq, dk, dv, None, None


_attention_core.defvjp(_attention_core_fwd, _attention_core_bwd)


def _pad_axis(x, axis: int, length: int):
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, pad)


def _check_dtypes(q, k, v):
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}")


def flash_attention(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    block_sizes: BlockSizes | None = None,
    interpret: bool | None = None,
    kernels: str | None = None,
):
    """Memory-efficient attention with the semantics of ``reference_attention``.

    q: [B, T, N, H]; k, v: [B, S, K, H] with N % K == 0 and T <= S (queries are the last T
    positions).  ``segment_ids=(q_ids [B,T], kv_ids [B,S])`` restricts attention to equal
    ids; ``sliding_window=w`` lets a query see itself and the w-1 keys before it;
    ``logits_soft_cap=c`` applies ``c * tanh(x / c)`` to the scaled logits.  Inputs may be
    f32 or bf16; accumulation is f32.  A query that sees no key returns zeros.
    ``kernels``: ``"mosaic_tpu"`` or ``"triton"`` (see module doc); None picks Triton on a GPU
    backend and Mosaic elsewhere.  ``interpret=None`` compiles on the family's platform (TPU,
    GPU) and interprets on CPU (see ``backend``).
    """
    _b, t, s, n, kh, h = check_attention_inputs(
        q, k, v, segment_ids, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )
    _check_dtypes(q, k, v)
    if kernels is None:
        kernels = "triton" if target_platform() == "gpu" else "mosaic_tpu"
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {sorted(KERNELS)}; got {kernels!r}")
    interpret = resolve_interpret(
        interpret, f"flash_attention ({kernels})", KERNELS[kernels].platform
    )
    if kernels == "triton":
        tiling = plan_triton_tiling(block_sizes or TRITON_BLOCK_SIZES, t, s)
        h_kernel = padded_head_dim(h)
    else:
        blocks = block_sizes or BlockSizes.default()
        tiling = plan_tiling(blocks, t, s, check_tpu_layout=not interpret)
        h_kernel = h
    cfg = FlashConfig(
        causal=bool(causal),
        sliding_window=None if sliding_window is None else int(sliding_window),
        soft_cap=None if logits_soft_cap is None else float(logits_soft_cap),
        scale=float(h**-0.5 if sm_scale is None else sm_scale),
        q_len=t,
        kv_len=s,
        groups=n // kh,
        has_segments=segment_ids is not None,
        tiling=tiling,
        interpret=interpret,
    )

    def head_major(x, length):
        return _pad_axis(_pad_axis(jnp.swapaxes(x, 1, 2), 2, length), 3, h_kernel)

    q_seg = kv_seg = None
    if segment_ids is not None:
        q_ids, kv_ids = (jnp.asarray(x, jnp.int32) for x in segment_ids)
        q_seg = _pad_axis(q_ids, 1, tiling.q_padded)[:, :, None]
        kv_seg = _pad_axis(kv_ids, 1, tiling.kv_padded)[:, None, :]
    o = _attention_core(
        head_major(q, tiling.q_padded),
        head_major(k, tiling.kv_padded),
        head_major(v, tiling.kv_padded),
        q_seg,
        kv_seg,
        cfg,
        kernels,
    )
    return jnp.swapaxes(o[:, :, :t, :h], 1, 2)
