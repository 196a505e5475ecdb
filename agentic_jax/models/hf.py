"""Hugging Face checkpoint interop, one mapping table per model family.

A HF checkpoint directory is a ``config.json`` plus safetensors weights (one ``model.safetensors``,
or shards listed by ``model.safetensors.index.json``).  The families this module reads and writes
(:data:`FAMILIES`) differ from our layout only mechanically:

* HF keeps one ``nn.Linear`` weight ``[out, in]`` per layer (and per expert); we keep ``[in,
  ...out]`` stacked on a leading layers axis (``q[L, D, N, H]``, experts ``gate[L_moe, E, D, F]``),
  so a HF weight maps to ours by a transpose and a reshape into one slot of a stacked leaf.
  Our RoPE uses HF's rotate-half layout, so q/k need no row permutation (but for DeepSeek's
  interleaved RoPE dimensions), and a fused HF projection (DeepSeek's ``kv_b_proj``) is split
  over our leaves by row.
* Config fields are renamed, and HF's rope parameters moved between versions (transformers 5 keeps
  ``rope_theta`` inside ``rope_parameters``; older configs have top-level ``rope_theta`` and
  ``rope_scaling``).  Both spellings are read; the older one is written, since every transformers
  version reads it.

A family is data: how its ``config.json`` reads into :class:`TransformerConfig` fields and back,
and its tensor rows (HF name, our path, HF shape, transposed or not) for every layer, a dense
layer's MLP and an MoE layer's router and experts.  :func:`_tensor_table` expands the rows over
layers and experts; loading, saving and the checks are written once for all families.

Export picks the family by what it can hold, not by a list of rules: a family can hold a config
when writing its ``config.json`` and reading it back gives the same architecture
(:func:`_architecture`) and its tensor rows cover every parameter.  A feature a family cannot
express (a sliding window in Llama, shared experts in Mixtral, a router noise weight anywhere)
therefore rules the family out, new config fields included, without a rule per feature.

Loading streams: shards are opened one at a time (the index says which tensors each holds) and
read one tensor at a time from ``safe_open(framework="numpy")`` into preallocated stacked host
buffers, so the checkpoint is never in memory beside our copy; saving writes the safetensors
format one tensor at a time.  Reading BF16 into numpy needs a safetensors release that maps it to
``ml_dtypes.bfloat16`` (0.8 does; 0.5 raises).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.hf_serving_files import serving_configs, write_serving_files
from agentic_jax.models.rope import yarn_mscale
from agentic_jax.models.transformer import param_shapes

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_ST_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}
# Tensors a checkpoint may carry that we rebuild ourselves: rotary ``inv_freq`` buffers, which old
# transformers versions persisted, and a tied LM head (checked in :func:`_ignored`).
_IGNORED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
# rope.py's llama3 defaults; HF has none, so they must be written out.
_LLAMA3_DEFAULTS = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
# Fields no config.json carries and that do not change what the model computes at inference:
# they pass through an export check unchanged (see :func:`_mismatch`).  A field here that adds a
# parameter (router noise, the balancing bias) is still caught, by the tensor rows' coverage.
_RUNTIME_FIELDS = (
    "dtype",
    "param_dtype",
    "attention_impl",
    "attention_chunk_size",
    "remat_policy",
    "scan_layers",
    "init_std",
    "capacity_factor",
    "moe_dispatch",
    "router_noise",
    "router_z_loss_coef",
    "aux_free_bias_rate",
)
# Fields compared in a canonical form by :func:`_architecture` (or, for a dense model, not at all).
_CANONICAL_FIELDS = (
    "rope_theta",
    "rope_scaling",
    "max_seq_len",
    "moe_layers",
    "d_ff",
    "moe_d_ff",
    "sliding_window",
    "sliding_window_pattern",
    "query_pre_attn_scalar",
)
_MOE_FIELDS = (
    "experts_per_token",
    "n_shared_experts",
    "router",
    "router_aux_loss_coef",
    "n_expert_groups",
    "topk_groups",
    "normalize_gates",
    "routed_scaling_factor",
)


# ---------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig: what every family shares


def _required(hf: Mapping[str, Any], key: str):
    if hf.get(key) is None:
        raise ValueError(f"HF config.json lacks required field {key!r}")
    return hf[key]


def _rope_from_hf(hf: Mapping[str, Any], max_pos: int) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) as transformers 5 resolves them (``standardize_rope_params``)."""
    given = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if any(isinstance(v, Mapping) for v in given.values()):
        raise NotImplementedError(f"per-layer-type rope parameters {dict(given)}")
    params = {k: v for k, v in given.items() if v is not None}
    kind = params.pop("rope_type", None) or params.get("type") or "default"
    params.pop("type", None)
    theta = float(params.pop("rope_theta", None) or hf.get("rope_theta") or 10000.0)
    partial = params.pop("partial_rotary_factor", None) or hf.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise NotImplementedError(f"partial_rotary_factor={partial}: RoPE on part of a head")
    if kind == "default":
        return theta, None
    if kind not in ("linear", "dynamic", "yarn", "llama3"):
        raise NotImplementedError(
            f"HF rope type {kind!r}; supported: linear, dynamic, yarn, llama3"
        )
    if kind == "dynamic":
        # HF grows dynamic NTK from max_position_embeddings, whatever the dict says.
        params["original_max_position_embeddings"] = max_pos
    if kind in ("yarn", "llama3"):
        params.setdefault("original_max_position_embeddings", max_pos)
    if kind == "yarn":
        params.setdefault("factor", max_pos / params["original_max_position_embeddings"])
        mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
        if "attention_factor" not in params and mscale and mscale_all_dim:
            params["attention_factor"] = yarn_mscale(params["factor"], mscale) / yarn_mscale(
                params["factor"], mscale_all_dim
            )
    return theta, {"type": kind, **params}


def _rope_to_hf(config: TransformerConfig) -> tuple[float, int, dict | None]:
    """(rope_theta, max_position_embeddings, rope_scaling) for HF."""
    scaling, max_pos = config.rope_scaling, config.max_seq_len
    if scaling is None:
        return config.rope_theta, max_pos, None
    kind = scaling["type"]
    rest = {k: v for k, v in scaling.items() if k not in ("type", "rope_type")}
    if kind == "ntk":
        # HF has no static NTK, but it is exactly a larger base: theta * factor^(d / (d - 2)).
        d = config.rope_dim
        return config.rope_theta * scaling["factor"] ** (d / (d - 2)), max_pos, None
    if kind == "dynamic":
        # HF's dynamic NTK grows from max_position_embeddings; that must be our original length.
        max_pos = rest.get("original_max_position_embeddings", max_pos)
    if kind == "llama3":
        rest = {**_LLAMA3_DEFAULTS, **rest}
    return config.rope_theta, max_pos, {"rope_type": kind, **rest}


# HF's activation names -> our ``mlp_activation`` (the gated MLP's: SwiGLU or Gemma's GeGLU).
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def _activation_from_hf(hf: Mapping[str, Any]) -> str:
    """``mlp_activation`` of HF's ``hidden_activation`` (Gemma's field) or ``hidden_act``."""
    name = hf.get("hidden_activation") or hf.get("hidden_act") or "silu"
    if name not in _ACTIVATIONS:
        raise NotImplementedError(
            f"hidden activation {name!r}; supported: {', '.join(_ACTIVATIONS)}"
        )
    return _ACTIVATIONS[name]


def _activation_to_hf(config: TransformerConfig) -> str:
    return next(hf for hf, ours in _ACTIVATIONS.items() if ours == config.mlp_activation)


def _common_from_hf(hf: Mapping[str, Any]) -> dict:
    """The :class:`TransformerConfig` fields every family spells the same way."""
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise NotImplementedError(
            "attention_bias / mlp_bias: the model has q/k/v biases only (no o_proj or MLP biases)"
        )
    d_model, n_heads = _required(hf, "hidden_size"), _required(hf, "num_attention_heads")
    max_pos = _required(hf, "max_position_embeddings")
    theta, scaling = _rope_from_hf(hf, max_pos)
    return dict(
        vocab_size=_required(hf, "vocab_size"),
        d_model=d_model,
        n_layers=_required(hf, "num_hidden_layers"),
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or d_model // n_heads,
        d_ff=_required(hf, "intermediate_size"),
        mlp_activation=_activation_from_hf(hf),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=max_pos,
    )


def _common_to_hf(config: TransformerConfig) -> dict:
    """The ``config.json`` fields every family spells the same way (a family may override)."""
    theta, max_pos, scaling = _rope_to_hf(config)
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.d_ff,
        "num_hidden_layers": config.n_layers,
        "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.n_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": _activation_to_hf(config),
        "max_position_embeddings": max_pos,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": config.tie_embeddings,
    }


def _moe_from_hf(hf: Mapping[str, Any], *n_experts_keys: str) -> dict:
    """The MoE fields HF's MoE families share.  ``n_experts_keys`` spell the expert count, in
    order (transformers 5 writes Qwen3-MoE's ``num_experts`` as ``num_local_experts``)."""
    n_experts = next((hf[k] for k in n_experts_keys if hf.get(k)), 0)
    if n_experts <= 0:
        raise ValueError(
            f"HF config.json has no {' or '.join(n_experts_keys)}: an MoE needs experts"
        )
    return dict(
        n_experts=n_experts,
        experts_per_token=_required(hf, "num_experts_per_tok"),
        router_aux_loss_coef=_required(hf, "router_aux_loss_coef"),
    )


def _moe_to_hf(config: TransformerConfig) -> dict:
    return {
        "num_experts_per_tok": config.experts_per_token,
        "router_aux_loss_coef": config.router_aux_loss_coef,
    }


def _window_per_layer_types(hf: Mapping[str, Any], window: int | None, first_windowed: int):
    """One window for the model from Qwen's per-layer switches (``layer_types``, else the layers
    >= ``max_window_layers``): the model applies one window to every layer or to none."""
    if window is None:
        return None
    n_layers = hf["num_hidden_layers"]
    types = hf.get("layer_types") or [
        "sliding_attention" if i >= first_windowed else "full_attention" for i in range(n_layers)
    ]
    sliding = {t == "sliding_attention" for t in types}
    if sliding == {False}:
        return None
    if sliding == {True}:
        return window
    raise NotImplementedError(
        f"{hf['model_type']} sliding window on some layers only ({types}); the model "
        "applies one window to every layer"
    )


# ---------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig: each family's own fields


def _read_llama(hf) -> dict:
    return {}


def _write_llama(c: TransformerConfig) -> dict:
    return {"attention_bias": False, "mlp_bias": False}


def _read_mistral(hf) -> dict:
    return {"sliding_window": hf.get("sliding_window", 4096)}


def _write_mistral(c: TransformerConfig) -> dict:
    return {"sliding_window": c.sliding_window}


def _read_qwen2(hf) -> dict:
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None
    return {
        "qkv_bias": True,
        "sliding_window": _window_per_layer_types(hf, window, hf.get("max_window_layers", 28)),
    }


def _write_qwen2(c: TransformerConfig) -> dict:
    return {
        "use_sliding_window": c.sliding_window is not None,
        "sliding_window": c.sliding_window,
        "max_window_layers": 0,
    }


def _read_mixtral(hf) -> dict:
    """Mixtral: every layer an MoE of ``intermediate_size`` experts, top-k then softmax (HF
    computes softmax, top-k, renormalise: the same gates).  ``router_jitter_noise`` is a
    training-time input jitter with no counterpart here; it is ignored."""
    return {
        "sliding_window": hf.get("sliding_window"),
        "router": "topk_softmax",
        **_moe_from_hf(hf, "num_local_experts"),
    }


def _write_mixtral(c: TransformerConfig) -> dict:
    return {
        "intermediate_size": c.expert_d_ff,
        "sliding_window": c.sliding_window,
        "num_local_experts": c.n_experts,
        "router_jitter_noise": 0.0,
        **_moe_to_hf(c),
    }


def _windows_from_layer_types(types, window: int | None) -> dict:
    """``sliding_window`` and ``sliding_window_pattern`` of HF's per-layer ``layer_types``."""
    if window is None or "sliding_attention" not in types:
        return {"sliding_window": None}
    pattern = None if set(types) == {"sliding_attention"} else tuple(types)
    return {"sliding_window": window, "sliding_window_pattern": pattern}


def _layer_types(c: TransformerConfig) -> list[str]:
    """HF's ``layer_types`` of each layer's window."""
    return ["full_attention" if w is None else "sliding_attention" for w in c.layer_windows]


def _read_qwen3(hf) -> dict:
    """Qwen3: QK-norm, and a window on the layers ``layer_types`` names (by default those >=
    ``max_window_layers``) when ``use_sliding_window``."""
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or [
        "sliding_attention" if window is not None and i >= first else "full_attention"
        for i in range(hf["num_hidden_layers"])
    ]
    return {"qk_norm": True, **_windows_from_layer_types(types, window)}


def _write_qwen3(c: TransformerConfig) -> dict:
    return {
        "use_sliding_window": c.sliding_window is not None,
        "sliding_window": c.sliding_window,
        "max_window_layers": 0,
        "layer_types": _layer_types(c),
        "attention_bias": False,
    }


def _qwen_moe_layers(hf) -> int | tuple[int, ...]:
    """Qwen2/3-MoE's MoE layers: every ``decoder_sparse_step``-th, less ``mlp_only_layers``
    (the same ``(i + 1) % step == 0`` rule as our ``moe_layers`` int)."""
    step = hf.get("decoder_sparse_step") or 1
    dense = set(hf.get("mlp_only_layers") or ())
    if not dense:
        return step
    return tuple(
        i for i in range(hf["num_hidden_layers"]) if i not in dense and (i + 1) % step == 0
    )


def _read_qwen3_moe(hf) -> dict:
    """Qwen3-MoE: softmax, top-k, and renormalised gates when ``norm_topk_prob``."""
    return {
        "qk_norm": True,
        "sliding_window": hf.get("sliding_window", 4096) if hf.get("use_sliding_window") else None,
        "moe_d_ff": _required(hf, "moe_intermediate_size"),
        "moe_layers": _qwen_moe_layers(hf),
        "router": "topk_softmax" if hf.get("norm_topk_prob") else "softmax_topk",
        **_moe_from_hf(hf, "num_experts", "num_local_experts"),
    }


def _write_qwen3_moe(c: TransformerConfig) -> dict:
    dense = [i for i in range(c.n_layers) if i not in c.moe_layer_ids]
    step = c.moe_layers if isinstance(c.moe_layers, int) else 1
    return {
        "use_sliding_window": c.sliding_window is not None,
        "sliding_window": c.sliding_window,
        "attention_bias": False,
        "moe_intermediate_size": c.expert_d_ff,
        "decoder_sparse_step": step,
        "mlp_only_layers": [] if isinstance(c.moe_layers, int) else dense,
        "num_experts": c.n_experts,
        "norm_topk_prob": c.router == "topk_softmax",
        **_moe_to_hf(c),
    }


def _read_deepseek_v3(hf) -> dict:
    """DeepSeek-V3: multi-head latent attention, and from layer ``first_k_dense_replace`` on
    MoE layers routed by ``sigmoid_topk`` (sigmoid scores, the selection biased by
    ``e_score_correction_bias``, the top-k within the ``topk_group`` best of ``n_group`` expert
    groups, gates renormalised when ``norm_topk_prob`` and scaled by ``routed_scaling_factor``)
    with ``n_shared_experts``.  ``aux_loss_alpha`` (DeepSeek's own field for its sequence-wise
    balance loss; transformers has none) is ``router_aux_loss_coef``.  YaRN's ``mscale_all_dim``
    stays in ``rope_scaling``, where MLA reads its softmax factor (``rope.mla_softmax_factor``).

    HF normalises both latents with a fixed eps of 1e-6 (``DeepseekV3RMSNorm``'s default), and
    our model with ``norm_eps``, so the two must agree.
    """
    if hf.get("rms_norm_eps", 1e-6) != 1e-6:
        raise NotImplementedError(
            f"DeepSeek-V3 rms_norm_eps={hf['rms_norm_eps']}: HF's latent norms use 1e-6, ours "
            "use norm_eps"
        )
    mla = {
        "attention_type": "mla",
        "q_lora_rank": hf.get("q_lora_rank"),
        "kv_lora_rank": _required(hf, "kv_lora_rank"),
        "qk_nope_head_dim": _required(hf, "qk_nope_head_dim"),
        "qk_rope_head_dim": _required(hf, "qk_rope_head_dim"),
        "v_head_dim": _required(hf, "v_head_dim"),
        "head_dim": _required(hf, "qk_rope_head_dim"),  # unused by MLA; HF's value
        "n_kv_heads": _required(hf, "num_attention_heads"),  # likewise
    }
    n_layers, first_moe = hf["num_hidden_layers"], hf["first_k_dense_replace"]
    if first_moe >= n_layers:
        return mla
    groups = hf.get("n_group") or 1
    return {
        **mla,
        "n_experts": _required(hf, "n_routed_experts"),
        "experts_per_token": _required(hf, "num_experts_per_tok"),
        "moe_d_ff": _required(hf, "moe_intermediate_size"),
        "moe_layers": tuple(range(first_moe, n_layers)),
        "n_shared_experts": hf["n_shared_experts"],
        "router": "sigmoid_topk",
        "n_expert_groups": groups,
        "topk_groups": hf.get("topk_group") or groups,
        "normalize_gates": bool(hf["norm_topk_prob"]),
        "routed_scaling_factor": hf["routed_scaling_factor"],
        "router_aux_loss_coef": hf["aux_loss_alpha"],
    }


def _write_deepseek_v3(c: TransformerConfig) -> dict:
    """MoE layers from ``first_k_dense_replace`` on (none: every layer dense), RoPE dimensions
    in rotate-half order."""
    moe = c.moe_layer_ids
    mla = {
        "q_lora_rank": c.q_lora_rank or None,
        "kv_lora_rank": c.kv_lora_rank,
        "qk_nope_head_dim": c.qk_nope_head_dim,
        "qk_rope_head_dim": c.qk_rope_head_dim,
        "v_head_dim": c.v_head_dim,
        "head_dim": c.qk_rope_head_dim,
        "num_key_value_heads": c.n_heads,
        "first_k_dense_replace": moe[0] if moe else c.n_layers,
        "rope_interleave": False,
        "attention_bias": False,
    }
    if not moe:
        return mla
    return {
        **mla,
        "n_routed_experts": c.n_experts,
        "num_experts_per_tok": c.experts_per_token,
        "moe_intermediate_size": c.expert_d_ff,
        "n_shared_experts": c.n_shared_experts,
        "n_group": c.n_expert_groups,
        "topk_group": c.topk_groups,
        "norm_topk_prob": c.normalize_gates,
        "routed_scaling_factor": c.routed_scaling_factor,
        "aux_loss_alpha": c.router_aux_loss_coef,
    }


def _read_olmoe(hf) -> dict:
    """OLMoE: every layer an MoE of ``intermediate_size`` experts (softmax, top-k, the gates
    renormalised when ``norm_topk_prob``), and QK-norm over the full projected width of q and of
    k.  HF sizes those norms by ``hidden_size``, so ``head_dim`` must be ``hidden_size / heads``."""
    if hf.get("clip_qkv") is not None:
        raise NotImplementedError(
            f"OLMoE clip_qkv={hf['clip_qkv']}: the model does not clip q, k, v"
        )
    head_dim, heads = hf.get("head_dim"), hf["num_attention_heads"]
    if head_dim and head_dim * heads != hf["hidden_size"]:
        raise NotImplementedError(
            f"OLMoE head_dim={head_dim} with {heads} heads: HF's QK-norms are hidden_size="
            f"{hf['hidden_size']} wide, so head_dim must be hidden_size / num_attention_heads"
        )
    return {
        "qk_norm": True,
        "qk_norm_scope": "full",
        "router": "topk_softmax" if hf.get("norm_topk_prob") else "softmax_topk",
        **_moe_from_hf(hf, "num_experts", "num_local_experts"),
    }


def _write_olmoe(c: TransformerConfig) -> dict:
    return {
        "intermediate_size": c.expert_d_ff,
        "num_experts": c.n_experts,
        "norm_topk_prob": c.router == "topk_softmax",
        "clip_qkv": None,
        "attention_bias": False,
        **_moe_to_hf(c),
    }


def _read_gemma2(hf) -> dict:
    """Gemma 2: sandwich norms scaled by ``1 + w``, GeGLU, embeddings times
    ``sqrt(hidden_size)``, attention logits scaled by ``query_pre_attn_scalar^-1/2``, soft-capped
    attention and output logits, and a window on the layers ``layer_types`` names (by default
    every other layer, from the first)."""
    if hf.get("use_bidirectional_attention"):
        raise NotImplementedError("Gemma 2 use_bidirectional_attention: the model is causal")
    types = hf.get("layer_types") or [
        "sliding_attention" if (i + 1) % 2 else "full_attention"
        for i in range(hf["num_hidden_layers"])
    ]
    return {
        "norm_type": "rms_plus_one",
        "norm_position": "sandwich",
        "scale_embeddings": True,
        "query_pre_attn_scalar": _required(hf, "query_pre_attn_scalar"),
        "attn_logit_softcap": hf.get("attn_logit_softcapping"),
        "final_logit_softcap": hf.get("final_logit_softcapping"),
        **_windows_from_layer_types(types, hf.get("sliding_window")),
    }


def _write_gemma2(c: TransformerConfig) -> dict:
    scalar = c.query_pre_attn_scalar or c.head_dim
    if scalar != int(scalar):
        raise NotImplementedError(
            f"query_pre_attn_scalar={scalar}: Gemma 2's (an int in transformers) is a whole number"
        )
    return {
        "hidden_activation": _activation_to_hf(c),
        "query_pre_attn_scalar": int(scalar),
        "attn_logit_softcapping": c.attn_logit_softcap,
        "final_logit_softcapping": c.final_logit_softcap,
        # HF builds a sliding mask even when no layer uses it, so it needs some window.
        "sliding_window": c.sliding_window or c.max_seq_len,
        "layer_types": _layer_types(c),
        "attention_bias": False,
    }


# ---------------------------------------------------------------------------------------------
# Tensor rows


class _Row(NamedTuple):
    """One HF tensor of a family's table.

    ``hf`` is its name (after ``model.layers.{i}.`` in a layer's rows; ``{e}`` makes one row per
    expert), ``ours`` its path in our tree (``/``-joined, under ``layers`` in a layer's rows),
    ``shape`` its HF shape in the symbols of :func:`_dims`, ``transpose`` whether it is an
    ``nn.Linear`` weight ``[out, in]`` (ours are ``[in, ...out]``).

    ``rows``, when set, says which of the HF tensor's first-axis rows are ours, in our order:
    ``rows(config, hf_config)`` gives one index array per path of ``ours`` (space-separated).
    It splits a fused HF projection over several of our leaves and reorders rows whose HF
    order differs (interleaved RoPE dimensions).
    """

    hf: str
    ours: str
    shape: str
    transpose: bool
    rows: Callable[[TransformerConfig, Mapping[str, Any]], list[np.ndarray]] | None = None


def _swiglu_rows(prefix: str, names: tuple[str, str, str], ours: str, width: str):
    """gate, up and down projections of one SwiGLU MLP (HF ``names`` in that order)."""
    gate, up, down = names
    return (
        _Row(f"{prefix}.{gate}.weight", f"{ours}/gate", f"{width} D", True),
        _Row(f"{prefix}.{up}.weight", f"{ours}/up", f"{width} D", True),
        _Row(f"{prefix}.{down}.weight", f"{ours}/down", f"D {width}", True),
    )


_PROJ = ("gate_proj", "up_proj", "down_proj")
_EMBED = (_Row("model.embed_tokens.weight", "embed", "V D", False),)
_HEAD = (
    _Row("model.norm.weight", "final_norm", "D", False),
    _Row("lm_head.weight", "lm_head", "V D", True),  # absent (skipped) when tied
)
_QKVO = (
    _Row("self_attn.q_proj.weight", "attn/q", "Q D", True),
    _Row("self_attn.k_proj.weight", "attn/k", "KV D", True),
    _Row("self_attn.v_proj.weight", "attn/v", "KV D", True),
    _Row("self_attn.o_proj.weight", "attn/o", "D Q", True),
)
_ATTENTION = (
    _Row("input_layernorm.weight", "attn_norm", "D", False),
    *_QKVO,
    _Row("post_attention_layernorm.weight", "mlp_norm", "D", False),
)
# Gemma 2's norms before and after attention and the MLP: its ``post_attention_layernorm`` is
# the attention output's norm, not the MLP input's.
_SANDWICH = (
    _Row("input_layernorm.weight", "attn_norm", "D", False),
    *_QKVO,
    _Row("post_attention_layernorm.weight", "attn_post_norm", "D", False),
    _Row("pre_feedforward_layernorm.weight", "mlp_norm", "D", False),
    _Row("post_feedforward_layernorm.weight", "mlp_post_norm", "D", False),
)
_QKV_BIAS = (
    _Row("self_attn.q_proj.bias", "attn/q_bias", "Q", False),
    _Row("self_attn.k_proj.bias", "attn/k_bias", "KV", False),
    _Row("self_attn.v_proj.bias", "attn/v_bias", "KV", False),
)
_QK_NORM = (
    _Row("self_attn.q_norm.weight", "attn/q_norm", "H", False),
    _Row("self_attn.k_norm.weight", "attn/k_norm", "H", False),
)
_QK_NORM_FULL = (  # OLMoE's, over every head's features
    _Row("self_attn.q_norm.weight", "attn/q_norm", "Q", False),
    _Row("self_attn.k_norm.weight", "attn/k_norm", "KV", False),
)
_MLP = _swiglu_rows("mlp", _PROJ, "mlp", "F")


def _rope_order(c: TransformerConfig, hf: Mapping[str, Any]) -> np.ndarray:
    """Our rotate-half order of the RoPE dimensions as HF rows: DeepSeek's ``rope_interleave``
    rotates pairs ``(x0, x1), (x2, x3), ...``, ours ``(x_i, x_{i + d/2})``, so ours are HF's even
    rows then its odd ones.  Queries and keys are permuted alike, so no score changes."""
    d = c.qk_rope_head_dim
    if hf.get("rope_interleave", True):
        return np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    return np.arange(d)


def _mla_query_rows(c: TransformerConfig, hf) -> list[np.ndarray]:
    """Each head's query is ``[nope | rope]`` in HF and ours; only the rope order differs."""
    head = np.concatenate([np.arange(c.qk_nope_head_dim), c.qk_nope_head_dim + _rope_order(c, hf)])
    return [(np.arange(c.n_heads)[:, None] * c.qk_head_dim + head).reshape(-1)]


def _mla_kv_a_rows(c: TransformerConfig, hf) -> list[np.ndarray]:
    """``[latent | shared rope key]`` in HF and ours; only the rope order differs."""
    r = c.kv_lora_rank
    return [np.concatenate([np.arange(r), r + _rope_order(c, hf)])]


def _mla_kv_b_rows(c: TransformerConfig, hf) -> list[np.ndarray]:
    """HF's fused ``kv_b_proj`` has each head's ``[k_nope | v]`` rows; ours are ``k_up``, ``v_up``."""
    width = c.qk_nope_head_dim + c.v_head_dim
    heads = np.arange(c.n_heads)[:, None] * width
    k = heads + np.arange(c.qk_nope_head_dim)
    v = heads + c.qk_nope_head_dim + np.arange(c.v_head_dim)
    return [k.reshape(-1), v.reshape(-1)]


# Without a q_lora_rank our tree has ``q`` and no ``q_a`` / ``q_b``, and the other way round.
_MLA = (
    _Row("input_layernorm.weight", "attn_norm", "D", False),
    _Row("self_attn.q_proj.weight", "attn/q", "QK D", True, _mla_query_rows),
    _Row("self_attn.q_a_proj.weight", "attn/q_a", "RQ D", True),
    _Row("self_attn.q_a_layernorm.weight", "attn/q_a_norm", "RQ", False),
    _Row("self_attn.q_b_proj.weight", "attn/q_b", "QK RQ", True, _mla_query_rows),
    _Row("self_attn.kv_a_proj_with_mqa.weight", "attn/kv_a", "KVA D", True, _mla_kv_a_rows),
    _Row("self_attn.kv_a_layernorm.weight", "attn/kv_a_norm", "R", False),
    _Row("self_attn.kv_b_proj.weight", "attn/k_up attn/v_up", "KVB R", True, _mla_kv_b_rows),
    _Row("self_attn.o_proj.weight", "attn/o", "D VO", True),
    _Row("post_attention_layernorm.weight", "mlp_norm", "D", False),
)


def _moe_rows(prefix: str, expert_names: tuple[str, str, str]) -> tuple[_Row, ...]:
    """An MoE layer's router ``{prefix}.gate`` and its experts ``{prefix}.experts.{e}``."""
    return (
        _Row(f"{prefix}.gate.weight", "moe/router", "E D", True),
        *_swiglu_rows(f"{prefix}.experts.{{e}}", expert_names, "moe", "X"),
    )


# DeepSeek-V3's MoE layer: the router with its selection bias, the experts, the shared experts.
_DEEPSEEK_MOE = (
    *_moe_rows("mlp", _PROJ),
    _Row("mlp.gate.e_score_correction_bias", "moe/router_bias", "E", False),
    *_swiglu_rows("mlp.shared_experts", _PROJ, "moe/shared", "S"),
)


def _dims(c: TransformerConfig) -> dict[str, int]:
    """The symbols of :class:`_Row` shapes."""
    return {
        "V": c.vocab_size,
        "D": c.d_model,
        "H": c.head_dim,
        "Q": c.n_heads * c.head_dim,
        "KV": c.n_kv_heads * c.head_dim,
        "F": c.d_ff,
        "X": c.expert_d_ff,
        "E": c.n_experts,
        # multi-head latent attention
        "R": c.kv_lora_rank,
        "RQ": c.q_lora_rank or 0,
        "QK": c.n_heads * c.qk_head_dim,
        "KVA": c.kv_lora_rank + c.qk_rope_head_dim,
        "KVB": c.n_heads * (c.qk_nope_head_dim + c.v_head_dim),
        "VO": c.n_heads * c.v_head_dim,
        "S": c.n_shared_experts * c.expert_d_ff,
    }


@dataclasses.dataclass(frozen=True)
class Family:
    """A HF model family: its names, how its ``config.json`` maps to ours, and its tensors.

    ``layer`` rows are every decoder layer's, ``mlp`` a dense layer's MLP, ``moe`` an MoE layer's
    router and experts.  A row whose path our tree lacks for a config (q/k/v biases without
    ``qkv_bias``, ``lm_head`` when tied) is left out of that config's table.  ``defaults`` are the
    HF class defaults a ``config.json`` may leave out where they differ from our readers'.
    """

    model_type: str
    architecture: str
    read: Callable[[Mapping[str, Any]], dict]
    write: Callable[[TransformerConfig], dict]
    layer: tuple[_Row, ...] = _ATTENTION
    mlp: tuple[_Row, ...] = _MLP
    moe: tuple[_Row, ...] = ()
    defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)


# In the order export tries them: the first that can hold a config names it.
FAMILIES = {
    f.model_type: f
    for f in (
        Family("llama", "LlamaForCausalLM", _read_llama, _write_llama),
        Family("mistral", "MistralForCausalLM", _read_mistral, _write_mistral),
        Family("qwen2", "Qwen2ForCausalLM", _read_qwen2, _write_qwen2, _ATTENTION + _QKV_BIAS),
        Family(
            "mixtral",
            "MixtralForCausalLM",
            _read_mixtral,
            _write_mixtral,
            moe=_moe_rows("block_sparse_moe", ("w1", "w3", "w2")),
            defaults={"rope_theta": 1e6, "router_aux_loss_coef": 0.001},
        ),
        Family("qwen3", "Qwen3ForCausalLM", _read_qwen3, _write_qwen3, _ATTENTION + _QK_NORM),
        Family(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            _read_qwen3_moe,
            _write_qwen3_moe,
            _ATTENTION + _QK_NORM,
            moe=_moe_rows("mlp", _PROJ),
            defaults={"router_aux_loss_coef": 0.001},
        ),
        Family(
            "deepseek_v3",
            "DeepseekV3ForCausalLM",
            _read_deepseek_v3,
            _write_deepseek_v3,
            _MLA,
            moe=_DEEPSEEK_MOE,
            # DeepseekV3Config's class defaults, and DeepSeek's for aux_loss_alpha
            defaults={
                "first_k_dense_replace": 3,
                "n_routed_experts": 256,
                "num_experts_per_tok": 8,
                "moe_intermediate_size": 2048,
                "n_shared_experts": 1,
                "n_group": 8,
                "topk_group": 4,
                "norm_topk_prob": True,
                "routed_scaling_factor": 2.5,
                "aux_loss_alpha": 0.001,
            },
        ),
        Family(
            "olmoe",
            "OlmoeForCausalLM",
            _read_olmoe,
            _write_olmoe,
            _ATTENTION + _QK_NORM_FULL,
            moe=_moe_rows("mlp", _PROJ),
            defaults={
                "rms_norm_eps": 1e-5,
                "num_experts": 64,
                "num_experts_per_tok": 8,
                "router_aux_loss_coef": 0.01,
            },
        ),
        Family(
            "gemma2",
            "Gemma2ForCausalLM",
            _read_gemma2,
            _write_gemma2,
            _SANDWICH,
            defaults={
                "head_dim": 256,
                "hidden_activation": "gelu_pytorch_tanh",
                "query_pre_attn_scalar": 256,
                "sliding_window": 4096,
                "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0,
                "tie_word_embeddings": True,
            },
        ),
    )
}


def _family(model_type) -> Family:
    if model_type not in FAMILIES:
        raise ValueError(
            f"unsupported HF model_type {model_type!r}; expected one of {tuple(FAMILIES)}"
        )
    return FAMILIES[model_type]


class _Part(NamedTuple):
    """Where (some of) a HF tensor's rows live in our tree."""

    path: tuple[str, ...]
    index: tuple[int, ...]  # its slot in the (stacked) leaf: () whole, (layer,), (layer, expert)
    rows: np.ndarray | None  # the HF rows that are this part, in our order; None: all, as they are


class _Tensor(NamedTuple):
    """One HF tensor of a config: the parts of our tree it holds and how its layout differs."""

    name: str
    parts: tuple[_Part, ...]
    hf_shape: tuple[int, ...]
    transpose: bool  # nn.Linear weight [out, in] vs our [in, ...out]

    def to_ours(self, array: np.ndarray, part: _Part) -> np.ndarray:
        """``part``'s rows of the HF ``array``, laid out as HF's ``[out, in]`` transposed."""
        rows = array if part.rows is None else array[part.rows]
        return rows.T if self.transpose else rows

    def to_hf(self, leaves: Mapping[tuple, Any], dtype) -> np.ndarray:
        """This HF tensor from our ``leaves`` (by path), one part at a time."""
        first = self.parts[0]
        if len(self.parts) == 1 and first.rows is None:  # the common case: no assembly
            return self._from_part(leaves, first)
        out = np.empty(self.hf_shape, dtype)
        for part in self.parts:
            out[part.rows] = self._from_part(leaves, part)
        return out

    def _from_part(self, leaves: Mapping[tuple, Any], part: _Part) -> np.ndarray:
        leaf = leaves[part.path]
        ours = np.asarray(leaf[part.index] if part.index else leaf)
        rows = self.hf_shape[0] if part.rows is None else len(part.rows)
        shape = (rows, *self.hf_shape[1:])
        return ours.reshape(shape[::-1]).T if self.transpose else ours.reshape(shape)


def _leaves_by_path(tree) -> tuple[dict, Any]:
    """{("layers", "attn", "q"): leaf, ...} and the treedef to rebuild the tree."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    return {tuple(k.key for k in path): leaf for path, leaf in flat}, treedef


def _tensor_table(c: TransformerConfig, family: Family, hf: Mapping[str, Any]) -> list[_Tensor]:
    """Every HF tensor of ``c`` in HF's order (embedding, layer by layer, final norm, head);
    ``hf`` is the ``config.json`` read or written (for layouts only it records).

    A layer's MLP rows index the stack of its own kind (dense layers and MoE layers are stacked
    separately, each in layer order; see ``transformer._segments``).
    """
    dims = _dims(c)
    present = set(_leaves_by_path(param_shapes(c))[0])

    def expand(rows, name_prefix: str, path_prefix: tuple, index: tuple) -> Iterator[_Tensor]:
        for row in rows:
            paths = [path_prefix + tuple(p.split("/")) for p in row.ours.split()]
            if not all(p in present for p in paths):
                continue
            shape = tuple(dims[s] for s in row.shape.split())
            selected = [None] * len(paths) if row.rows is None else row.rows(c, hf)
            for e in range(c.n_experts) if "{e}" in row.hf else (None,):
                slot = index if e is None else (*index, e)
                parts = tuple(_Part(p, slot, r) for p, r in zip(paths, selected))
                yield _Tensor(name_prefix + row.hf.format(e=e), parts, shape, row.transpose)

    moe_ids, seen = set(c.moe_layer_ids), {"mlp": 0, "moe": 0}
    table = list(expand(_EMBED, "", (), ()))
    for i in range(c.n_layers):
        prefix, kind = f"model.layers.{i}.", "moe" if i in moe_ids else "mlp"
        table += expand(family.layer, prefix, ("layers",), (i,))
        table += expand(getattr(family, kind), prefix, ("layers",), (seen[kind],))
        seen[kind] += 1
    table += expand(_HEAD, "", (), ())
    return table


# ---------------------------------------------------------------------------------------------
# Which family holds a config


def _read_config(hf: Mapping[str, Any], family: Family, overrides: Mapping[str, Any]):
    hf = {**family.defaults, **hf}
    fields = {**_common_from_hf(hf), **family.read(hf)}
    return TransformerConfig(**{**fields, **overrides})


def from_hf_config(hf: Mapping[str, Any], **overrides) -> TransformerConfig:
    """The :class:`TransformerConfig` of a HF ``config.json`` dict, plus ``overrides``."""
    return _read_config(hf, _family(hf.get("model_type")), overrides)


def _architecture(c: TransformerConfig) -> dict:
    """What ``c`` computes, in a form two spellings of one model agree on: rope as HF writes it
    (static NTK is a larger base), each layer's window, the MoE layers as indices, the dense
    width only when a dense layer uses it, no MoE fields for a dense model, no GQA widths
    under MLA and no ``query_pre_attn_scalar`` that is ``head_dim`` (the default scale)."""
    skip = set(_RUNTIME_FIELDS) | set(_CANONICAL_FIELDS)
    if not c.n_experts:
        skip |= set(_MOE_FIELDS)
    if c.mla:  # MLA has its own widths and no kv heads
        skip |= {"head_dim", "n_kv_heads"}
    arch = {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name not in skip}
    arch["rope"] = _rope_to_hf(c)
    arch["windows"] = c.layer_windows
    arch["moe_layers"] = c.moe_layer_ids
    scalar = c.query_pre_attn_scalar
    arch["query_pre_attn_scalar"] = None if scalar in (None, c.head_dim) else scalar
    if len(c.moe_layer_ids) < c.n_layers:
        arch["d_ff"] = c.d_ff
    if c.n_experts:
        arch["expert_d_ff"] = c.expert_d_ff
    return arch


def _mismatch(config: TransformerConfig, family: Family) -> str | None:
    """Why ``family`` cannot hold ``config``, or None when it can: its ``config.json`` must read
    back as the same architecture, and its rows must cover every parameter."""
    try:
        runtime = {name: getattr(config, name) for name in _RUNTIME_FIELDS}
        hf = _write_config(config, family)
        back = _read_config(hf, family, runtime)
    except (ValueError, NotImplementedError) as e:
        return str(e)
    ours, theirs = _architecture(config), _architecture(back)
    lost = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if lost:
        return "cannot express " + ", ".join(f"{k}={ours.get(k)!r}" for k in lost)
    covered = {p.path for t in _tensor_table(config, family, hf) for p in t.parts}
    uncovered = sorted("/".join(p) for p in _leaves_by_path(param_shapes(config))[0])
    uncovered = [p for p in uncovered if tuple(p.split("/")) not in covered]
    if uncovered:
        return f"has no tensor for {uncovered}"
    return None


def _export_family(config: TransformerConfig, model_type: str | None = None) -> Family:
    """``model_type``'s family if it can hold ``config``, else the first of :data:`FAMILIES` that
    can; fails naming what each family lacks."""
    candidates = [_family(model_type)] if model_type else list(FAMILIES.values())
    reasons = {}
    for family in candidates:
        reason = _mismatch(config, family)
        if reason is None:
            return family
        reasons[family.model_type] = reason
    detail = "; ".join(f"{name}: {why}" for name, why in reasons.items())
    raise NotImplementedError(f"no HF family can hold this config ({detail})")


def hf_model_type(config: TransformerConfig) -> str:
    """The HF family :func:`save_hf_checkpoint` writes ``config`` as: the first of
    :data:`FAMILIES` that can hold it (Llama, else Mistral for a sliding window, else Qwen2 for
    q/k/v biases, else Qwen3, the MoE families and Gemma 2, each for what it alone expresses)."""
    return _export_family(config).model_type


def hf_linear_modules(
    config: TransformerConfig,
) -> dict[tuple[tuple[str, ...], tuple[int, ...]], str]:
    """``{(our path, slot): HF module}``, e.g. ``(("layers", "attn", "q"), (3,)):
    "model.layers.3.self_attn.q_proj"``: the ``nn.Linear`` of each slot of our weights in the
    family :func:`save_hf_checkpoint` writes, for the weights one HF tensor holds whole, in our
    row order (what an adapter of that weight maps onto; a weight HF splits or reorders is
    left out)."""
    family = _export_family(config)
    table = _tensor_table(config, family, _write_config(config, family))
    return {
        (t.parts[0].path, t.parts[0].index): t.name.removesuffix(".weight")
        for t in table
        if t.transpose and len(t.parts) == 1 and t.parts[0].rows is None
    }


def _write_config(config: TransformerConfig, family: Family) -> dict:
    return {
        "architectures": [family.architecture],
        "model_type": family.model_type,
        **_common_to_hf(config),
        **family.write(config),
    }


def to_hf_config(
    config: TransformerConfig, dtype: str | None = None, tokenizer=None, *, model_type=None
) -> dict:
    """The HF ``config.json`` dict of ``config`` as ``model_type`` (default
    :func:`hf_model_type`; a family that cannot hold the config is an error).

    ``tokenizer`` (anything with ``bos_id`` / ``eos_id`` / ``pad_id``) supplies the special-token
    ids; without them ``generate`` falls back to the architecture's defaults (Llama's 1 and 2,
    Qwen2's none), which need not be the tokenizer's.  An id the tokenizer lacks is left out.
    """
    hf = _write_config(config, _export_family(config, model_type))
    hf["torch_dtype"] = jnp.dtype(dtype or config.param_dtype).name
    if tokenizer is not None:
        ids = {
            "bos_token_id": tokenizer.bos_id,
            "eos_token_id": tokenizer.eos_id,
            "pad_token_id": tokenizer.pad_id,
        }
        hf.update({k: v for k, v in ids.items() if v is not None})
    return hf


# ---------------------------------------------------------------------------------------------
# Checks


def _ignored(name: str, config: TransformerConfig) -> bool:
    return bool(_IGNORED.fullmatch(name)) or (config.tie_embeddings and name == "lm_head.weight")


def check_params(config: TransformerConfig, params) -> dict:
    """Fails, naming the leaves, unless ``params`` has the tree and shapes of ``config``; returns
    the leaves by path.  Checked before writing anything, so a mismatch leaves no partial files."""
    leaves, _ = _leaves_by_path(params)
    expected, _ = _leaves_by_path(param_shapes(config))
    wrong = sorted(
        "/".join(p)
        for p in set(leaves) | set(expected)
        if p not in leaves or p not in expected or np.shape(leaves[p]) != expected[p].shape
    )
    if wrong:
        raise ValueError(f"params do not match the config's parameter tree at {wrong}")
    return leaves


# ---------------------------------------------------------------------------------------------
# Loading


def _weight_files(path: Path) -> dict[str, list[str]]:
    """{file: [tensor names]} from the shard index, or from the single weights file."""
    index = path / INDEX_FILE
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"shard index {index} has no 'weight_map' object")
        names: dict[str, list[str]] = {}
        for name, file in weight_map.items():
            names.setdefault(file, []).append(name)
        files = names
    elif (path / SINGLE_FILE).exists():
        with safe_open(str(path / SINGLE_FILE), framework="numpy") as f:
            files = {SINGLE_FILE: list(f.keys())}
    else:
        raise FileNotFoundError(f"no {SINGLE_FILE} or {INDEX_FILE} in {path}")
    for file in files:
        if not (path / file).exists():
            raise FileNotFoundError(f"weights shard {path / file} (listed in {index}) is missing")
    return files


def _check_names(
    files: dict[str, list[str]], table: list[_Tensor], config: TransformerConfig, model_type: str
):
    """Fails before any data is read if a tensor is unknown, missing or duplicated."""
    found = Counter(n for names in files.values() for n in names if not _ignored(n, config))
    expected = {t.name for t in table}
    unknown = sorted(set(found) - expected)
    missing = sorted(expected - set(found))
    duplicated = sorted(n for n, count in found.items() if count > 1)
    for what, names in (("unknown", unknown), ("missing", missing), ("duplicated", duplicated)):
        if names:
            raise ValueError(
                f"{what} tensors in the HF checkpoint for {model_type} "
                f"config: {names[:8]}{' ...' if len(names) > 8 else ''}"
            )


def _read(f, name: str) -> np.ndarray:
    try:
        return f.get_tensor(name)
    except TypeError as e:  # old safetensors cannot build BF16 numpy arrays
        raise TypeError(f"cannot read tensor {name!r} into numpy ({e}); upgrade safetensors") from e


def load_hf_checkpoint(
    path, *, param_dtype: str = "float32", **config_overrides
) -> tuple[TransformerConfig, dict]:
    """(config, params) of a local HF causal-LM directory of one of :data:`FAMILIES`.

    Parameters are cast to ``param_dtype``; ``config_overrides`` set non-architecture fields such
    as ``dtype`` or ``attention_impl``.  Rotary ``inv_freq`` buffers, and ``lm_head.weight`` of a
    tied model, are skipped; any other tensor we have no place for is an error.  Shards are read
    one after another, each opened once, tensor by tensor.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"HF checkpoint directory {path} does not exist")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path / 'config.json'} not found")
    hf = json.loads((path / "config.json").read_text())
    family = _family(hf.get("model_type"))
    config = _read_config(hf, family, {"param_dtype": param_dtype, **config_overrides})
    table = _tensor_table(config, family, hf)
    files = _weight_files(path)
    _check_names(files, table, config, family.model_type)
    by_name = {t.name: t for t in table}
    shapes, treedef = _leaves_by_path(param_shapes(config))
    buffers = {p: np.empty(s.shape, s.dtype) for p, s in shapes.items()}
    for file, names in files.items():
        with safe_open(str(path / file), framework="numpy") as f:
            for name in names:
                if _ignored(name, config):
                    continue
                t, array = by_name[name], _read(f, name)
                if array.shape != t.hf_shape:
                    raise ValueError(
                        f"HF tensor {name} has shape {array.shape}; the config implies {t.hf_shape}"
                    )
                for part in t.parts:
                    dest = buffers[part.path][part.index]
                    dest[...] = t.to_ours(array, part).reshape(dest.shape)
    # Popping hands each host buffer to the device and frees it before the next one is copied.
    leaves = [jnp.asarray(buffers.pop(p)) for p in shapes]
    return config, jax.tree_util.tree_unflatten(treedef, leaves)


# ---------------------------------------------------------------------------------------------
# Saving


def _write_safetensors(path: Path, tensors: list[tuple[_Tensor, Any]], dtype: np.dtype):
    """Writes the safetensors format (u64 header size, JSON header, raw little-endian data)
    streaming: ``tensors`` pairs a name with a thunk, called only when its bytes are written."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t, _ in tensors:
        size = math.prod(t.hf_shape) * dtype.itemsize
        header[t.name] = {
            "dtype": _ST_DTYPES[dtype.name],
            "shape": list(t.hf_shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned, as the reference writer does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _t, produce in tensors:
            np.ascontiguousarray(produce(), dtype=dtype).tofile(f)


def _shards(table: list[_Tensor], itemsize: int, max_shard_bytes: int) -> list[list[_Tensor]]:
    """Consecutive groups under ``max_shard_bytes`` (a larger tensor gets a shard of its own)."""
    shards, size = [[]], 0
    for t in table:
        nbytes = math.prod(t.hf_shape) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    return shards


def save_hf_checkpoint(
    path,
    config: TransformerConfig,
    params,
    *,
    dtype: str | None = None,
    max_shard_bytes: int = 5 * 10**9,
    tokenizer: Tokenizer | None = None,
    model_type: str | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> Path:
    """Writes ``config.json`` and safetensors weights that ``transformers`` loads as
    ``model_type`` (default :func:`hf_model_type`).  Tensors are cast to ``dtype`` (default
    ``config.param_dtype``) and written one at a time; over ``max_shard_bytes`` the weights are
    sharded with a ``model.safetensors.index.json``.  Refuses a directory that already holds
    weights, since stale shards would mix with the new ones.

    ``tokenizer``, if given, puts its special-token ids in ``config.json`` (see
    :func:`to_hf_config`) and writes the files that make the checkpoint usable by other tools
    (:mod:`agentic_jax.models.hf_serving_files`): ``tokenizer.json``, ``tokenizer_config.json``
    with the chat template, and ``generation_config.json`` with ``sampling``'s defaults.
    """
    path = Path(path)
    if path.exists() and any(path.glob("*.safetensors*")):
        raise FileExistsError(f"{path} already holds safetensors weights")
    if sampling is not None and tokenizer is None:
        raise ValueError("sampling defaults go in generation_config.json, which needs a tokenizer")
    leaves = check_params(config, params)
    hf_config = to_hf_config(config, dtype, tokenizer, model_type=model_type)
    serving = (
        None if tokenizer is None else serving_configs(tokenizer, config.max_seq_len, sampling)
    )
    np_dtype = np.dtype(jnp.dtype(dtype or config.param_dtype))
    table = _tensor_table(config, FAMILIES[hf_config["model_type"]], hf_config)

    def producer(t: _Tensor):
        return lambda: t.to_hf(leaves, np_dtype)

    path.mkdir(parents=True, exist_ok=True)
    shards = _shards(table, np_dtype.itemsize, max_shard_bytes)
    names = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    )
    for name, shard in zip(names, shards):
        _write_safetensors(path / name, [(t, producer(t)) for t in shard], np_dtype)
    if len(shards) > 1:
        total = sum(math.prod(t.hf_shape) for t in table) * np_dtype.itemsize
        index = {
            "metadata": {"total_size": total},
            "weight_map": {t.name: name for name, shard in zip(names, shards) for t in shard},
        }
        (path / INDEX_FILE).write_text(json.dumps(index, indent=2))
    if tokenizer is not None:
        write_serving_files(path, tokenizer, serving)
    (path / "config.json").write_text(json.dumps(hf_config, indent=2))
    return path
