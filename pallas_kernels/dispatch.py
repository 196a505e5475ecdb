"""Picking the fastest maintained attention implementation for the current backend.

* GPU: tokamax's ``dot_product_attention`` when tokamax is installed (its Mosaic GPU /
  Triton flash kernels, with soft-capping); otherwise cuDNN's fused flash attention through
  ``jax.nn.dot_product_attention(implementation="cudnn")`` when cuDNN supports the call
  (bf16/f16, head_dim a multiple of 8 up to 256, no soft cap, no two-sided window);
  otherwise XLA.  The package's own Triton kernels (``flash_attention`` on a GPU) are not
  chosen here until the benchmark has measured them against these.
* TPU: this package's Pallas ``flash_attention`` (compiled by Mosaic).
* anything else: XLA (``reference_attention``; the Pallas kernel would only run
  interpreted).

The mask convention of this project (queries are the last T of S positions, Mistral
windows, segment ids) is translated to the ``jax.nn`` arguments: natively when T == S and
there are no segments, otherwise as an explicit [B, 1, T, S] boolean mask (cuDNN then
takes it as a bias: still fused, but that mask costs O(B T S) memory), and rows that see
no key are zeroed afterwards, as the contract requires.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging

import jax
import jax.numpy as jnp

from pallas_kernels.backend import target_platform
from pallas_kernels.flash_attention import flash_attention
from pallas_kernels.masks import dense_mask
from pallas_kernels.reference import check_attention_inputs, reference_attention

_log = logging.getLogger(__name__)
_CUDNN_DTYPES = (jnp.bfloat16, jnp.float16)


@functools.cache
def tokamax_module():
    """The ``tokamax`` module, or None when it is not installed or does not import (a broken
    install -- a missing dependency, a JAX too old for it -- is logged, then ignored)."""
    if importlib.util.find_spec("tokamax") is None:
        return None
    try:
        return importlib.import_module("tokamax")
    except Exception as err:
        _log.warning(
            "tokamax is installed but does not import (%s: %s); not using it",
            type(err).__name__,
            err,
        )
        return None


def choose_attention_backend(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    platform: str | None = None,
) -> str:
    """Name of the implementation :func:`gpu_attention` will try first for these inputs:
    ``"tokamax"``, ``"cudnn"``, ``"pallas"`` or ``"xla"``."""
    del k, v, segment_ids, sm_scale
    platform = platform or target_platform()
    if platform == "tpu":
        return "pallas"
    if platform != "gpu":
        return "xla"
    if tokamax_module() is not None:
        return "tokamax"
    h = q.shape[-1]
    cudnn_ok = (
        q.dtype in _CUDNN_DTYPES
        and logits_soft_cap is None
        and h % 8 == 0
        and h <= 256
        and (causal or sliding_window is None)
    )
    return "cudnn" if cudnn_ok else "xla"


def jax_nn_mask_arguments(q, k, *, causal=True, segment_ids=None, sliding_window=None):
    """``mask`` / ``is_causal`` / ``local_window_size`` for ``jax.nn``-style attention APIs
    that reproduce this project's mask rule (their causal mask is top-left aligned, so
    T != S needs an explicit mask)."""
    b, t = q.shape[:2]
    s = k.shape[1]
    if segment_ids is None and t == s:
        window = None
        if sliding_window is not None:
            window = (sliding_window - 1, 0 if causal else sliding_window - 1)
        return dict(mask=None, is_causal=bool(causal), local_window_size=window)
    mask = dense_mask(
        b, t, s, causal=causal, sliding_window=sliding_window, segment_ids=segment_ids
    )
    return dict(mask=mask[:, None], is_causal=False, local_window_size=None)


def _fused(backend, q, k, v, options):
    """tokamax or cuDNN with this project's mask rule, zeros for rows that see no key."""
    mask_args = jax_nn_mask_arguments(
        q,
        k,
        causal=options["causal"],
        segment_ids=options["segment_ids"],
        sliding_window=options["sliding_window"],
    )
    if backend == "tokamax":
        out = tokamax_module().dot_product_attention(
            q,
            k,
            v,
            scale=options["sm_scale"],
            logits_soft_cap=options["logits_soft_cap"],
            **mask_args,
        )
    else:
        out = jax.nn.dot_product_attention(
            q, k, v, scale=options["sm_scale"], implementation="cudnn", **mask_args
        )
    mask = mask_args["mask"]
    if mask is None:  # causal / windowed / full self-attention: every row sees a key
        return out
    # A finite mask bias turns an empty row into the mean of V; the contract says zeros.
    seen = jnp.swapaxes(mask.any(axis=-1), 1, 2)[..., None]  # [B, T, 1, 1]
    return jnp.where(seen, out, 0).astype(out.dtype)


def gpu_attention(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    block_sizes=None,
    interpret=None,
    return_backend: bool = False,
):
    """Attention by the fastest working implementation for this backend (see module doc).

    Same arguments and result as ``flash_attention``; ``block_sizes`` and ``interpret`` are
    used only when the Pallas kernel is chosen.  If the chosen fused implementation rejects
    the call while tracing (an unsupported shape, say), XLA is used instead.  The choice is
    logged (INFO; WARNING on fallback) and, with ``return_backend=True``, returned:
    ``(out, name)``.
    """
    check_attention_inputs(
        q, k, v, segment_ids, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )
    options = dict(
        causal=causal,
        segment_ids=segment_ids,
        sliding_window=sliding_window,
        logits_soft_cap=logits_soft_cap,
        sm_scale=sm_scale,
    )
    backend = choose_attention_backend(q, k, v, **options)
    if backend == "pallas":
        out = flash_attention(q, k, v, block_sizes=block_sizes, interpret=interpret, **options)
        return _report(out, backend, return_backend)
    if backend == "xla":
        return _report(reference_attention(q, k, v, **options), backend, return_backend)
    try:
        out = _fused(backend, q, k, v, options)
    except (NotImplementedError, ValueError, RuntimeError) as err:
        _log.warning("gpu_attention: %s rejected the call (%s); using xla", backend, err)
        backend, out = "xla", reference_attention(q, k, v, **options)
    return _report(out, backend, return_backend)


def _report(out, backend: str, return_backend: bool):
    _log.info("gpu_attention: using %s", backend)
    return (out, backend) if return_backend else out
