"""The compression job: a trained model quantised or 2:4-pruned after training, saved as a model
every consumer loads (``agentic-jax train --gin_file compress_int8``, ``compress_awq_int4``,
``compress_nf4``, ``prune_wanda_2_4``).

The work directory gets::

    config.gin, operative_config.gin   the gin config as parsed and as used
    model/ + tokenizer.json            the compressed model (``models.export.load_checkpoint``:
                                       quantised weights come back as ``QuantizedWeight``)
    compression_report.json           bytes and held-out perplexity before and after

so ``agentic-jax generate --checkpoint``, ``serve --checkpoint`` and ``init_from=`` of RL with
LoRA adapters (QLoRA) take it as they take a trained run; full fine-tuning refuses it.
"""

from __future__ import annotations

import json
import os
import shutil

import gin
import jax
import jax.numpy as jnp

from agentic_jax import config as gin_config
from agentic_jax.models.awq import awq_params
from agentic_jax.models.calibration import calibration_tokens
from agentic_jax.models.compression import perplexity
from agentic_jax.models.export import load_checkpoint, save_model
from agentic_jax.models.pruning import prune_params
from agentic_jax.models.quantization import (
    FORMATS,
    is_quantized,
    param_bytes,
    projection_layout,
    quantize_params,
)

QUANTIZERS = ("rtn", "awq")  # round-to-nearest (quantization.quantize_params), AWQ (awq.py)
PRUNERS = ("magnitude", "wanda")  # 2:4 sparsity (pruning.prune_params)
METHODS = QUANTIZERS + PRUNERS
REPORT = "compression_report.json"


@gin.configurable
def compress_model(
    workdir: str,
    *,
    init_from: str,
    method: str = "rtn",
    fmt: str | None = "int8",
    group_size: int | None = None,
    symmetric: bool = True,
    lm_head: bool = False,
    grid: int = 20,
    calibration_rows: int = 16,
    heldout_rows: int = 16,
    length: int = 128,
) -> dict:
    """Compresses the model of run ``init_from`` into ``workdir`` (see the module docstring).

    ``method``: ``"rtn"`` or ``"awq"`` quantise the projections to ``fmt`` (``group_size``,
    ``symmetric``, ``lm_head`` as in ``quantize_params``; AWQ searches ``grid`` exponents);
    ``"magnitude"`` or ``"wanda"`` prune them 2:4, then quantise to ``fmt`` by round-to-nearest
    unless ``fmt`` is None.  AWQ and Wanda calibrate on ``calibration_rows`` rows of ``length``
    tokens of the shipped corpus's train split; perplexity is measured on ``heldout_rows`` such
    rows of its held-out split.  Returns the report's numbers.
    """
    if method not in METHODS:
        raise ValueError(f"compress_model: method={method!r}; expected one of {METHODS}")
    if fmt not in (*FORMATS, *((None,) if method in PRUNERS else ())):
        raise ValueError(
            f"compress_model: fmt={fmt!r}; method={method!r} takes one of {FORMATS}"
            + (" or None (sparse float weights)" if method in PRUNERS else "")
        )
    config, params, tokenizer = load_checkpoint(init_from)
    if any(is_quantized(w) for w in jax.tree.leaves(params, is_leaf=is_quantized)):
        raise ValueError(f"compress_model: {init_from} is compressed already; give its float model")
    if length > config.max_seq_len:
        raise ValueError(
            f"compress_model: length={length} exceeds the model's max_seq_len={config.max_seq_len}"
        )
    gin_config.save_config(workdir, operative=False)
    calibration = None
    if method in ("awq", "wanda"):
        calibration = calibration_tokens(tokenizer, rows=calibration_rows, length=length)
    heldout = calibration_tokens(tokenizer, rows=heldout_rows, length=length, split="heldout")
    options = dict(group_size=group_size, symmetric=symmetric, lm_head=lm_head)
    if method == "awq":
        compressed = awq_params(params, config, calibration, fmt, grid=grid, **options)
    elif method == "rtn":
        compressed = quantize_params(params, config, fmt, **options)
    else:
        compressed = prune_params(params, config, method, calibration)
        sparsity = projection_sparsity(compressed)
        if fmt is not None:
            compressed = quantize_params(compressed, config, fmt, **options)

    model_dir = os.path.join(workdir, "model")
    if os.path.exists(model_dir):  # a rerun replaces the model it wrote
        shutil.rmtree(model_dir)
    save_model(model_dir, config, jax.device_get(compressed))
    tokenizer.save(os.path.join(workdir, "tokenizer.json"))
    before, after = perplexity(params, config, heldout), perplexity(compressed, config, heldout)
    report = {
        "init_from": init_from,
        "method": method,
        "fmt": fmt,
        **options,
        "bytes_before": param_bytes(params),
        "bytes_after": param_bytes(compressed),
        "perplexity_before": before,
        "perplexity_after": after,
        "perplexity_delta": after - before,
        "calibration_tokens": 0 if calibration is None else int(calibration.size),
        "heldout_tokens": int(heldout.size),
        **({"projection_sparsity": sparsity} if method in PRUNERS else {}),
    }
    with open(os.path.join(workdir, REPORT), "w") as f:
        json.dump(report, f, indent=2)
    gin_config.save_config(workdir, operative=True)
    return {k: float(v) for k, v in report.items() if k.startswith(("bytes", "perplexity"))}


def projection_sparsity(params) -> float:
    """The fraction of zeros among the projection weights (those ``prune_params`` prunes)."""
    zeros = total = 0
    for path, w in jax.tree_util.tree_leaves_with_path(params):
        if projection_layout(tuple(k.key for k in path)) is not None:
            zeros, total = zeros + int(jnp.sum(w == 0)), total + w.size
    return zeros / total
