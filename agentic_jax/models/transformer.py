"""The decoder-only transformer as pure functions over a parameter pytree.

Pre-norm residual blocks (RMSNorm -> attention with RoPE -> residual; RMSNorm -> SwiGLU MLP ->
residual) stacked on a leading ``layers`` axis and run with ``jax.lax.scan``; final RMSNorm and an
LM head tied to the embedding or separate.  This is the Llama / Mistral / Qwen2 architecture by
default; the config also selects multi-head latent attention (DeepSeek-V2/V3), QK-norm, per-layer
sliding/global patterns, logit soft-caps, LayerNorm and post/sandwich norms (docs/models.md).

Every parameter has a tuple of logical axis names (:func:`param_axes`), and activations are
constrained at block boundaries by logical name; :mod:`sharding` alone maps names to mesh axes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.models import fp8, moe, quantization
from agentic_jax.models.attention import attention
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.rope import apply_rope, mla_softmax_factor, rope_tables
from pallas_kernels.reference import soft_cap
from sharding import with_logical_constraint
from sharding.mesh import active_axis_size
from sharding.names import BTD, BTF, BTKH, BTNH, BTV
from sharding.ring_attention import from_zigzag, to_zigzag


class ParamSpec(NamedTuple):
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: str  # "normal:<std>" | "ones" | "zeros"


def _swiglu_specs(lead, lead_axes, d, f, std, out_std) -> dict:
    """gate, up ``[*lead, D, F]`` and down ``[*lead, F, D]``: a SwiGLU MLP (or a stack of them)."""
    return {
        "gate": ParamSpec((*lead, d, f), (*lead_axes, "embed", "mlp"), f"normal:{std}"),
        "up": ParamSpec((*lead, d, f), (*lead_axes, "embed", "mlp"), f"normal:{std}"),
        "down": ParamSpec((*lead, f, d), (*lead_axes, "mlp", "embed"), f"normal:{out_std}"),
    }


def _moe_specs(c: TransformerConfig, n: int, std: float, out_std: float) -> dict:
    """The ``n`` MoE layers' routers and experts (see :mod:`agentic_jax.models.moe`).

    Noise weights start at zero, as in Shazeer et al. 2017 (the router itself is random: zero
    logits would tie and send every token to the same k experts); the aux-free bias is state,
    not a parameter the gradient reaches.
    """
    D, E = c.d_model, c.n_experts
    specs = {
        "router": ParamSpec((n, D, E), ("layers", "embed", "expert"), f"normal:{std}"),
        **_swiglu_specs((n, E), ("layers", "expert"), D, c.expert_d_ff, std, out_std),
    }
    if c.router_noise:
        specs["router_noise"] = ParamSpec((n, D, E), ("layers", "embed", "expert"), "zeros")
    if c.has_router_bias:
        specs["router_bias"] = ParamSpec((n, E), ("layers", "expert"), "zeros")
    if c.n_shared_experts:
        width = c.n_shared_experts * c.expert_d_ff
        specs["shared"] = _swiglu_specs((n,), ("layers",), D, width, std, out_std)
    return specs


def _norm_specs(c: TransformerConfig, names, lead, lead_axes) -> dict:
    """Each named norm's scale over ``d_model`` (and, for LayerNorm, its ``<name>_bias``); a
    ``rms_plus_one`` scale ``w`` multiplies by ``1 + w``, so it starts at zero."""
    specs, init = {}, "zeros" if c.norm_type == "rms_plus_one" else "ones"
    for name in names:
        shape, axes = (*lead, c.d_model), (*lead_axes, "norm")
        specs[name] = ParamSpec(shape, axes, init)
        if c.norm_type == "layer":
            specs[f"{name}_bias"] = ParamSpec(shape, axes, "zeros")
    return specs


def _block_norm_names(c: TransformerConfig) -> tuple[str, ...]:
    """The norms around each sub-layer that ``norm_position`` asks for (see :func:`_residual`)."""
    pre = ("attn_norm", "mlp_norm") if c.norm_position != "post" else ()
    post = ("attn_post_norm", "mlp_post_norm") if c.norm_position != "pre" else ()
    return pre + post


def _mla_specs(c: TransformerConfig, std: float, out_std: float) -> dict:
    """Multi-head latent attention's projections (DeepSeek-V2, Liu et al. 2024).

    ``kv_a`` makes each token's latent and its shared rope key in one matmul, ``[D, r + d_rope]``
    (the latent is RMS-normalised by ``kv_a_norm``); ``k_up`` and ``v_up`` expand the latent into
    every head's no-position key and value; queries come through ``q_a`` / ``q_a_norm`` / ``q_b``
    when ``q_lora_rank`` is set, else one ``q``.
    """
    L, D, N = c.n_layers, c.d_model, c.n_heads
    r, qk, dv = c.kv_lora_rank, c.qk_head_dim, c.v_head_dim
    up_axes = ("layers", "kv_lora", "q_heads", "head_dim")
    attn = {
        "kv_a": ParamSpec(
            (L, D, r + c.qk_rope_head_dim), ("layers", "embed", "kv_lora"), f"normal:{std}"
        ),
        "kv_a_norm": ParamSpec((L, r), ("layers", "norm"), "ones"),
        "k_up": ParamSpec((L, r, N, c.qk_nope_head_dim), up_axes, f"normal:{std}"),
        "v_up": ParamSpec((L, r, N, dv), up_axes, f"normal:{std}"),
        "o": ParamSpec(
            (L, N, dv, D), ("layers", "q_heads", "head_dim", "embed"), f"normal:{out_std}"
        ),
    }
    if c.q_lora_rank:
        rq = c.q_lora_rank
        attn["q_a"] = ParamSpec((L, D, rq), ("layers", "embed", "q_lora"), f"normal:{std}")
        attn["q_a_norm"] = ParamSpec((L, rq), ("layers", "norm"), "ones")
        attn["q_b"] = ParamSpec(
            (L, rq, N, qk), ("layers", "q_lora", "q_heads", "head_dim"), f"normal:{std}"
        )
    else:
        attn["q"] = ParamSpec(
            (L, D, N, qk), ("layers", "embed", "q_heads", "head_dim"), f"normal:{std}"
        )
    return attn


def _gqa_specs(c: TransformerConfig, std: float, out_std: float) -> dict:
    """Grouped-query attention's projections (and the QK-norm scales: one ``head_dim`` vector
    shared by the heads, Qwen3, or one per head and feature over the full width, OLMoE)."""
    L, D, N, K, H = c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim
    attn = {
        "q": ParamSpec((L, D, N, H), ("layers", "embed", "q_heads", "head_dim"), f"normal:{std}"),
        "k": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), f"normal:{std}"),
        "v": ParamSpec((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim"), f"normal:{std}"),
        "o": ParamSpec(
            (L, N, H, D), ("layers", "q_heads", "head_dim", "embed"), f"normal:{out_std}"
        ),
    }
    if c.qkv_bias:
        attn["q_bias"] = ParamSpec((L, N, H), ("layers", "q_heads", "head_dim"), "zeros")
        attn["k_bias"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "zeros")
        attn["v_bias"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "zeros")
    if c.qk_norm and c.qk_norm_scope == "full":
        attn["q_norm"] = ParamSpec((L, N, H), ("layers", "q_heads", "head_dim"), "ones")
        attn["k_norm"] = ParamSpec((L, K, H), ("layers", "kv_heads", "head_dim"), "ones")
    elif c.qk_norm:
        attn["q_norm"] = ParamSpec((L, H), ("layers", "norm"), "ones")
        attn["k_norm"] = ParamSpec((L, H), ("layers", "norm"), "ones")
    return attn


def _specs(c: TransformerConfig) -> dict:
    """The single table of parameter shapes, logical axes and initialisers."""
    L, D, F, V = c.n_layers, c.d_model, c.d_ff, c.vocab_size
    std, out_std = c.init_std, c.init_std / math.sqrt(2 * L)
    attn = (_mla_specs if c.mla else _gqa_specs)(c, std, out_std)
    layers = {"attn": attn, **_norm_specs(c, _block_norm_names(c), (L,), ("layers",))}
    n_moe = len(c.moe_layer_ids)
    if n_moe < L:  # the dense layers' MLPs, stacked in layer order
        layers["mlp"] = _swiglu_specs((L - n_moe,), ("layers",), D, F, std, out_std)
    if n_moe:
        layers["moe"] = _moe_specs(c, n_moe, std, out_std)
    specs = {
        "embed": ParamSpec((V, D), ("vocab", "embed"), f"normal:{std}"),
        "layers": layers,
        **_norm_specs(c, ("final_norm",), (), ()),
    }
    if not c.tie_embeddings:
        specs["lm_head"] = ParamSpec((D, V), ("embed", "vocab"), f"normal:{std}")
    return specs


def _is_spec(x) -> bool:
    return isinstance(x, ParamSpec)


def param_axes(config: TransformerConfig) -> dict:
    """Pytree (matching :func:`init_params`) of logical-axis tuples, one per parameter."""
    return jax.tree.map(lambda s: s.axes, _specs(config), is_leaf=_is_spec)


def param_shapes(config: TransformerConfig) -> dict:
    """Pytree of ``jax.ShapeDtypeStruct`` matching :func:`init_params`, without allocating."""
    dtype = config.storage_dtype
    return jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, dtype), _specs(config), is_leaf=_is_spec
    )


def init_params(config: TransformerConfig, key) -> dict:
    """Random parameters: N(0, std) matrices (output projections scaled by 1/sqrt(2L)), unit norms."""
    specs = _specs(config)
    leaves, treedef = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(key, len(leaves))
    dtype = config.storage_dtype

    def make(spec: ParamSpec, k):
        if spec.init == "ones":
            return jnp.ones(spec.shape, dtype)
        if spec.init == "zeros":
            return jnp.zeros(spec.shape, dtype)
        std = float(spec.init.split(":")[1])
        return (std * jax.random.truncated_normal(k, -3.0, 3.0, spec.shape, jnp.float32)).astype(
            dtype
        )

    return jax.tree.unflatten(treedef, [make(s, k) for s, k in zip(leaves, keys)])


def param_count(config: TransformerConfig, *, active: bool = False) -> int:
    """Parameters in the model; ``active``: those one token uses, counting only
    ``experts_per_token`` of each MoE layer's ``n_experts`` routed experts (Mixtral's 47B total
    are 13B active)."""
    leaves = jax.tree.leaves(_specs(config), is_leaf=_is_spec)
    total = sum(math.prod(s.shape) for s in leaves)
    if not active:
        return total
    idle = config.n_experts - config.experts_per_token
    return total - len(config.moe_layer_ids) * idle * 3 * config.d_model * config.expert_d_ff


def flops_per_token(
    config: TransformerConfig, seq_len: int, *, causal: bool = True, training: bool = True
) -> float:
    """Model FLOPs per token (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B).

    ``6 N + 6 L n_heads (d_qk + d_v) T`` for training (forward = a third of it; ``d_qk = d_v =
    head_dim`` but for MLA, whose scores and values have their own widths), where N counts the
    parameters used in matmuls (the embedding lookup is free; a tied table is used once as the LM
    head; a mixture of experts counts its *active* parameters, the k experts a token runs through
    and the router) and the attention term is halved for causal masks, whose upper triangle is
    skipped.  Dropped assignments (a capacity factor) are not subtracted: MFU is of the model.
    """
    n_matmul = param_count(config, active=True) - (
        0 if config.tie_embeddings else config.vocab_size * config.d_model
    )
    if config.has_router_bias:  # the per-expert bias is added, not multiplied
        n_matmul -= len(config.moe_layer_ids) * config.n_experts
    v_dim = config.v_head_dim if config.mla else config.head_dim
    attn = 6 * config.n_layers * config.n_heads * (config.qk_head_dim + v_dim) * seq_len
    if causal:
        attn /= 2
    total = 6 * n_matmul + attn
    return total if training else total / 3


def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight, in float32."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def layer_norm(x, weight, bias, eps):
    """LayerNorm (Ba et al. 2016): (x - mean) / sqrt(var + eps) * weight + bias, in float32."""
    x32 = x.astype(jnp.float32)
    centred = x32 - jnp.mean(x32, axis=-1, keepdims=True)
    normed = centred * jax.lax.rsqrt(jnp.mean(jnp.square(centred), axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32) + bias.astype(jnp.float32)).astype(x.dtype)


def _norm(config: TransformerConfig, p, name: str, x):
    """The norm ``p[name]`` on ``x``: RMSNorm, LayerNorm with ``p[name + "_bias"]``, or Gemma's
    RMSNorm scaled by ``1 + w`` (in float32, as Gemma computes it)."""
    if config.norm_type == "layer":
        return layer_norm(x, p[name], p[f"{name}_bias"], config.norm_eps)
    if config.norm_type == "rms_plus_one":
        return rms_norm(x, 1.0 + p[name].astype(jnp.float32), config.norm_eps)
    return rms_norm(x, p[name], config.norm_eps)


def final_norm(params, config: TransformerConfig, x):
    """The norm after the last layer (the LM head's input), in the compute dtype."""
    names = ("final_norm", "final_norm_bias")
    p = {n: params[n].astype(config.compute_dtype) for n in names if n in params}
    return _norm(config, p, "final_norm", x)


def segment_positions(segment_ids):
    """Positions restarting at 0 at the start of every segment of a packed row."""
    idx = jnp.arange(segment_ids.shape[-1])
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[..., :1], bool), segment_ids[..., 1:] != segment_ids[..., :-1]],
        axis=-1,
    )
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=segment_ids.ndim - 1)


def self_attention(config: TransformerConfig, segment_ids, *, layout: str = "contiguous"):
    """The training/prefill ``attend``: causal self-attention within segments, no state.

    ``layout`` is the order of the sequence (``zigzag`` for the ``ring`` implementation, see
    :func:`hidden_states`)."""
    seg = None if segment_ids is None else (segment_ids, segment_ids)

    def attend(q, k, v, state, window):
        o = attention(
            q,
            k,
            v,
            causal=True,
            segment_ids=seg,
            sliding_window=window,
            logits_soft_cap=config.attn_logit_softcap,
            implementation=config.attention_impl,
            chunk_size=config.attention_chunk_size,
            layout=layout,
        )
        return o, state

    return attend


_PROJECTION_INPUTS = contextvars.ContextVar("projection_inputs", default=None)


@contextlib.contextmanager
def record_projection_inputs():
    """Records the input ``x`` of every projection the forwards inside it run (calibration of
    AWQ and Wanda): ``with record_projection_inputs() as inputs:`` leaves ``{name: [x, ...]}``
    with one array per call, in layer order.  The forward must run eagerly, not under ``jit``
    or ``scan`` (``config.replace(scan_layers=False, remat_policy="none")``)."""
    inputs = {}
    token = _PROJECTION_INPUTS.set(inputs)
    try:
        yield inputs
    finally:
        _PROJECTION_INPUTS.reset(token)


def _record_input(name, x) -> None:
    inputs = _PROJECTION_INPUTS.get()
    if inputs is None:
        return
    if isinstance(x, jax.core.Tracer):
        raise ValueError(
            "record_projection_inputs needs an eager forward: run it with "
            "config.replace(scan_layers=False, remat_policy='none') outside jit"
        )
    inputs.setdefault(name, []).append(x)


def _dense(eq, x, w, name, lora, dropout, precision="default", quantized_matmul="xla"):
    """``einsum(eq, x, w)``, plus LoRA's low-rank path ``dropout(x) · A · B`` when the layer carries
    an adapter ``lora[name] = {"a": [in..., r], "b": [r, out...]}`` for this projection (the α/r
    scale is already folded into B; see :mod:`agentic_jax.models.lora`).  A DoRA adapter also
    carries its magnitude ``"m": [out...]``, which rescales the sum (:func:`_dora_scale`).
    ``precision="fp8"`` runs the einsum as an FP8 matmul (:func:`agentic_jax.models.fp8.fp8_einsum`);
    the LoRA path stays in the compute dtype.  A :class:`~agentic_jax.models.quantization.
    QuantizedWeight` ``w`` is dequantised to ``x``'s dtype first (jit fuses the two), or with
    ``quantized_matmul="pallas"`` multiplied by the kernel that reads its packed codes (every
    ``eq`` here contracts x's trailing input axes with w's leading ones, as the kernel does)."""
    _record_input(name, x)
    if quantization.is_quantized(w) and quantized_matmul == "pallas":
        y = w.matmul(x)
    else:
        if quantization.is_quantized(w):  # weight-only quantisation: dequantised where it is used
            w = w.dequantize(x.dtype)
        y = fp8.fp8_einsum(eq, x, w) if precision == "fp8" else jnp.einsum(eq, x, w)
    if name not in lora:
        return y
    if dropout is not None:  # {"rate": [], "key": {name: key}}
        keep = 1.0 - dropout["rate"]
        x = jnp.where(
            jax.random.bernoulli(dropout["key"][name], keep, x.shape), x / keep, 0
        ).astype(x.dtype)
    a, b = lora[name]["a"], lora[name]["b"]
    y = y + jnp.tensordot(jnp.tensordot(x, a, a.ndim - 1), b, 1)
    if "m" in lora[name]:
        y = y * _dora_scale(w, a, b, lora[name]["m"]).astype(y.dtype)
    return y


def _dora_scale(w, a, b, m):
    """DoRA's per-output-unit factor ``m / ||W + A B||_c`` (Liu et al. 2024, arXiv:2402.09353):
    ``x W' = (x W + x A B) · m / ||W + A B||_c`` for ``W' = m (W + A B) / ||W + A B||_c``, the norm
    taken over the input dims of each output unit.  As in the paper (§4.3) and PEFT, the norm is
    a constant of the gradient (``stop_gradient``): ``A``, ``B`` and ``m`` get their gradients
    through the rescaled output, and the backward pass stores nothing of ``W + A B``."""
    n_in = a.ndim - 1
    v = w.astype(jnp.float32) + jnp.tensordot(
        a.astype(jnp.float32), b.astype(jnp.float32), 1, precision=jax.lax.Precision.HIGHEST
    )
    norm = jnp.sqrt(jnp.sum(jnp.square(v), axis=tuple(range(n_in))))
    return m.astype(jnp.float32) / jax.lax.stop_gradient(norm)


def _gqa_attention(config: TransformerConfig, a, h, cos, sin, attend, state, window, dense):
    """Grouped-query attention on the normed input ``h``: ``(output [B,T,D], state)``.

    QK-norm normalises queries and keys before RoPE, so that their dot products, and with them
    the attention logits, cannot grow with the projections' scale: each head's (Qwen3) or all
    heads' features at once (``qk_norm_scope="full"``, OLMoE).  ``query_pre_attn_scalar`` (Gemma
    2) scales logits by ``s^-1/2`` in place of ``head_dim^-1/2``: the queries are rescaled by
    ``sqrt(head_dim / s)``, so every ``attend`` (kernels and caches) keeps its own scale.
    """
    q = dense("btd,dnh->btnh", h, a["q"], "q")
    k = dense("btd,dkh->btkh", h, a["k"], "k")
    v = dense("btd,dkh->btkh", h, a["v"], "v")
    if config.qkv_bias:
        q, k, v = q + a["q_bias"], k + a["k_bias"], v + a["v_bias"]
    if config.qk_norm:
        q, k = _qk_norm(config, q, a["q_norm"]), _qk_norm(config, k, a["k_norm"])
    scalar = config.query_pre_attn_scalar
    if scalar is not None and scalar != config.head_dim:
        q = (q * math.sqrt(config.head_dim / scalar)).astype(q.dtype)
    q = with_logical_constraint(apply_rope(q, cos, sin), BTNH)
    k = with_logical_constraint(apply_rope(k, cos, sin), BTKH)
    v = with_logical_constraint(v, BTKH)
    o, state = attend(q, k, v, state, window)
    return dense("btnh,nhd->btd", o, a["o"], "o"), state


def _qk_norm(config: TransformerConfig, x, weight):
    """RMSNorm of ``x [B, T, heads, head_dim]`` over ``head_dim``, or over ``(heads, head_dim)``
    when ``qk_norm_scope="full"`` (``weight [heads, head_dim]``)."""
    if config.qk_norm_scope == "head":
        return rms_norm(x, weight, config.norm_eps)
    flat = rms_norm(x.reshape(*x.shape[:2], -1), weight.reshape(-1), config.norm_eps)
    return flat.reshape(x.shape)


def _mla_attention(
    config: TransformerConfig, a, h, cos, sin, attend, state, window, dense, absorbed
):
    """Multi-head latent attention on ``h``: ``(output [B,T,D], state)``.

    Head n scores key s by ``q_nope_n · (W_uk,n c_s) + q_rope_n · k_rope_s`` with ``c_s`` the
    token's normed latent and ``k_rope_s`` one RoPE key shared by the heads (RoPE cannot pass
    through ``W_uk``, hence the decoupled dimensions).  The training path materialises every
    head's key ``[W_uk,n c_s ; k_rope_s]`` and value ``W_uv,n c_s``.  The ``absorbed`` path
    (decoders) moves ``W_uk`` into the query, ``(W_uk,n^T q_nope_n ; q_rope_n) · (c_s ; k_rope_s)``,
    and ``W_uv`` after the softmax, ``W_uv,n Σ_s p_ns c_s``: attention is then multi-query with
    one key ``(c_s ; k_rope_s)`` of width ``r + d_rope`` per token, which serves as its own value
    (the first ``r`` output features are kept), so a cache holds only that.

    ``attend`` scales scores by the inverse square root of the width it is given; queries are
    rescaled so that this is ``1 / sqrt(d_nope + d_rope)`` whatever the width (the training
    path pads queries, keys and values to a common width with zeros, which changes no score),
    times DeepSeek's YaRN factor (:func:`~agentic_jax.models.rope.mla_softmax_factor`).
    """
    r, d_nope, qk, dv = (
        config.kv_lora_rank,
        config.qk_nope_head_dim,
        config.qk_head_dim,
        config.v_head_dim,
    )
    if config.q_lora_rank:
        q_latent = rms_norm(
            dense("btd,dr->btr", h, a["q_a"], "q_a"), a["q_a_norm"], config.norm_eps
        )
        q = dense("btr,rnh->btnh", q_latent, a["q_b"], "q_b")
    else:
        q = dense("btd,dnh->btnh", h, a["q"], "q")
    q_nope, q_rope = q[..., :d_nope], apply_rope(q[..., d_nope:], cos, sin)
    kv = dense("btd,dr->btr", h, a["kv_a"], "kv_a")
    latent = rms_norm(kv[..., :r], a["kv_a_norm"], config.norm_eps)
    k_rope = apply_rope(kv[:, :, None, r:], cos, sin)  # [B, T, 1, d_rope]
    if absorbed:
        q_latent = jnp.einsum("btnh,rnh->btnr", q_nope, a["k_up"])
        q = jnp.concatenate([q_latent, q_rope], axis=-1)
        k = v = jnp.concatenate([latent[:, :, None], k_rope], axis=-1)
    else:
        k_nope = jnp.einsum("btr,rnh->btnh", latent, a["k_up"])
        k_rope = jnp.broadcast_to(k_rope, (*k_nope.shape[:3], k_rope.shape[-1]))
        q = jnp.concatenate([q_nope, q_rope], axis=-1)
        k = jnp.concatenate([k_nope, k_rope], axis=-1)
        v = jnp.einsum("btr,rnh->btnh", latent, a["v_up"])
        width = max(qk, dv)
        q, k, v = (jnp.pad(x, ((0, 0),) * 3 + ((0, width - x.shape[-1]),)) for x in (q, k, v))
        k, v = with_logical_constraint(k, BTNH), with_logical_constraint(v, BTNH)
    scale = math.sqrt(q.shape[-1] / qk) * mla_softmax_factor(config)
    if scale != 1:
        q = (q * scale).astype(q.dtype)
    o, state = attend(with_logical_constraint(q, BTNH), k, v, state, window)
    # Absorbed: the first r features are the attended latent, which W_uv expands per head.
    o = jnp.einsum("btnr,rnh->btnh", o[..., :r], a["v_up"]) if absorbed else o[..., :dv]
    return dense("btnh,nhd->btd", o, a["o"], "o"), state


def _residual(config: TransformerConfig, p, name: str, x, sublayer):
    """``x + sublayer(...)`` with the norms ``norm_position`` places around the sub-layer:
    ``pre`` normalises its input (Llama), ``post`` its output (OLMo 2), ``sandwich`` both
    (Gemma 2).  ``sublayer(h) -> (y, extra)``; returns ``(x + y, extra)``."""
    h = x if config.norm_position == "post" else _norm(config, p, f"{name}_norm", x)
    y, extra = sublayer(h)
    if config.norm_position != "pre":
        y = _norm(config, p, f"{name}_post_norm", y)
    return with_logical_constraint(x + y, BTD), extra


def _block(
    config: TransformerConfig,
    p,
    x,
    cos,
    sin,
    attend,
    state,
    key,
    *,
    window,
    dropless,
    absorbed,
):
    """One residual block on ``x[B,T,D]``; ``p`` holds this layer's parameters.

    ``attend(q, k, v, state, window) -> (o, state)`` is where decoders plug in a KV cache:
    ``state`` is this layer's slice of whatever per-layer state the caller threads through the
    layers, ``window`` the layer's attention window (None: global).  Under MLA, ``absorbed``
    hands ``attend`` the absorbed form (see :func:`_mla_attention`).
    LoRA adapters, when present, are ``p["lora"]``, with dropout keys in ``p["lora_dropout"]``.
    A mixture-of-experts layer has ``p["moe"]`` in place of ``p["mlp"]`` (``key`` draws its
    router noise; ``dropless`` lifts its capacity) and also returns its router statistics.
    """
    dtype = config.compute_dtype
    p = dict(p)
    dropout = p.pop("lora_dropout", None)  # PRNG keys take no dtype cast
    moe_params = p.pop("moe", None)  # cast by moe_mlp: its router stays float32
    p = jax.tree.map(  # a quantised weight stays packed: _dense dequantises it
        lambda a: a if quantization.is_quantized(a) else a.astype(dtype),
        p,
        is_leaf=quantization.is_quantized,
    )
    dense = functools.partial(
        _dense,
        lora=p.get("lora", {}),
        dropout=dropout,
        precision=config.matmul_precision,
        quantized_matmul=config.quantized_matmul,
    )

    def attention_sublayer(h):
        if config.mla:
            return _mla_attention(
                config, p["attn"], h, cos, sin, attend, state, window, dense, absorbed
            )
        return _gqa_attention(config, p["attn"], h, cos, sin, attend, state, window, dense)

    def mlp_sublayer(h):
        if moe_params is not None:
            return moe.moe_mlp(moe_params, h, config, key=key, dropless=dropless)
        m = p["mlp"]
        hidden = _ACTIVATIONS[config.mlp_activation](
            dense("btd,df->btf", h, m["gate"], "gate")
        ) * dense("btd,df->btf", h, m["up"], "up")
        hidden = with_logical_constraint(hidden, BTF)
        return dense("btf,fd->btd", hidden, m["down"], "down"), None

    x, state = _residual(config, p, "attn", x, attention_sublayer)
    x, stats = _residual(config, p, "mlp", x, mlp_sublayer)
    return x, (state, stats)


# The gated MLP's activation: SwiGLU (Shazeer 2020) or GeGLU with tanh-approximate GELU (Gemma).
_ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
}

_REMAT = {
    "full": None,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


def _check_tokens(config: TransformerConfig, tokens, positions, segment_ids):
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"tokens must be an integer array [B, T]; got {tokens.dtype}{tokens.shape}"
        )
    for name, arr in (("positions", positions), ("segment_ids", segment_ids)):
        if arr is not None and arr.shape != tokens.shape:
            raise ValueError(
                f"{name} must have the shape of tokens {tokens.shape}; got {arr.shape}"
            )


def _segments(config: TransformerConfig):
    """Runs of consecutive layers with the same MLP kind and attention window, ``(start, stop,
    kind, first, window)``: layers ``start:stop`` use ``params["layers"][kind][first : first +
    stop - start]`` (``mlp`` or ``moe``, each stacked over its own layers), so each run is one
    ``scan`` with a static window (kernels need it static)."""
    moe, runs, seen = set(config.moe_layer_ids), [], {"mlp": 0, "moe": 0}
    for i, window in enumerate(config.layer_windows):
        kind = "moe" if i in moe else "mlp"
        if runs and (runs[-1][2], runs[-1][4]) == (kind, window):
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, kind, seen[kind], window])
        seen[kind] += 1
    return [tuple(run) for run in runs]


def _rows(tree, start, stop):
    """Layers ``start:stop`` of a tree stacked over layers (untouched when that is all of it)."""
    return jax.tree.map(lambda a: a if (start, stop) == (0, a.shape[0]) else a[start:stop], tree)


def embed_tokens(params, config: TransformerConfig, tokens):
    """The embedding rows ``[B, T, D]`` of ``tokens`` in the compute dtype: the first layer's input;
    times ``sqrt(d_model)`` rounded to the compute dtype when ``scale_embeddings`` (Gemma)."""
    x = jnp.take(params["embed"], tokens, axis=0).astype(config.compute_dtype)
    if config.scale_embeddings:
        x = x * jnp.asarray(math.sqrt(config.d_model), config.compute_dtype)
    return with_logical_constraint(x, BTD)


def hidden_states(
    params,
    config: TransformerConfig,
    tokens,
    *,
    positions=None,
    segment_ids=None,
    attend=None,
    layer_state=None,
    key=None,
    return_aux: bool = False,
    dropless: bool | None = None,
    absorbed: bool | None = None,
):
    """Final-norm hidden states ``[B, T, D]`` (the LM head's input).

    Decoders pass ``attend`` (see :func:`_block`) and ``layer_state``, a pytree whose leaves have a
    leading ``n_layers`` axis (a KV cache); the result is then ``(hidden, new_layer_state)``.
    ``key`` draws training-time randomness (MoE router noise).  With ``return_aux`` the result
    also ends with the auxiliary outputs: ``{}`` for a dense model, else the MoE layers' router
    statistics stacked over them (see :func:`agentic_jax.models.moe.moe_mlp`) and ``loss``, their
    weighted auxiliary loss, which a training loss adds to its mean; without ``return_aux`` they
    go to the active ``moe.collect_aux`` (how ``training.make_update`` adds them to any
    trainer's loss).  ``dropless`` overrides
    whether MoE layers drop tokens over capacity: by default decoders (``attend`` given) never
    do, so a token's output does not depend on the batch it shares, and training does.  Under
    multi-head latent attention an ``attend`` hook gets the absorbed form, whose keys and values
    are each token's latent (what a KV cache stores; see :func:`_mla_attention`); ``absorbed``
    overrides that (``False``: the training path's per-head keys, for a hook that measures).

    With ``attention_impl="ring"`` on a mesh whose ``sequence`` axis has n > 1 devices, the
    layers run on the sequence in zig-zag order (``sharding.ring_attention.to_zigzag``: device i
    holds chunks i and 2n-1-i of 2n, so causal attention costs every device the same): tokens,
    positions and segment ids are reordered together on the way in, so RoPE and the masks see
    each token's own position, and the hidden states are put back in order on the way out.
    """
    _check_tokens(config, tokens, positions, segment_ids)
    if positions is None:
        positions = (
            segment_positions(segment_ids)
            if segment_ids is not None
            else jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        )
    ring = active_axis_size("sequence") if attend is None and config.attention_impl == "ring" else 1
    if ring > 1:
        tokens, positions = to_zigzag(tokens, ring), to_zigzag(positions, ring)
        segment_ids = None if segment_ids is None else to_zigzag(segment_ids, ring)
    x = embed_tokens(params, config, tokens)
    cos, sin = rope_tables(config, positions)
    stateful = attend is not None
    layout = "zigzag" if ring > 1 else "contiguous"
    attend = attend or self_attention(config, segment_ids, layout=layout)
    x, layer_state, stats = apply_layers(
        config,
        params["layers"],
        x,
        cos,
        sin,
        attend,
        layer_state,
        key=key,
        dropless=stateful if dropless is None else dropless,
        absorbed=stateful if absorbed is None else absorbed,
    )
    h = final_norm(params, config, x)
    if ring > 1:
        h = with_logical_constraint(from_zigzag(h, ring), BTD)
    out = (h, layer_state) if stateful else (h,)
    aux = _aux(config, [s for s in stats if s is not None])
    if return_aux:
        out += (aux,)
    else:
        moe.report_aux(aux)
    return out if len(out) > 1 else h


def apply_layers(
    config: TransformerConfig,
    layers,
    x,
    cos,
    sin,
    attend,
    layer_state=None,
    *,
    key=None,
    dropless: bool = False,
    absorbed: bool = False,
):
    """``(x, layer_state, stats)`` after the ``config.n_layers`` blocks of ``layers`` (leaves with a
    leading layer axis), rematerialised and scanned as the config says; ``attend``,
    ``layer_state`` and ``absorbed`` as in :func:`_block`, ``stats`` the MoE runs' router
    statistics.  A pipeline stage runs its slice of a dense model's stack with
    ``config.replace(n_layers=slice)``."""
    keys = None if key is None else jax.random.split(key, config.n_layers)

    def block_with(window):
        def block(x, p, state, key):
            return _block(
                config,
                p,
                x,
                cos,
                sin,
                attend,
                state,
                key,
                window=window,
                dropless=dropless,
                absorbed=absorbed,
            )

        if config.remat_policy != "none":
            return jax.checkpoint(block, policy=_REMAT[config.remat_policy])
        return block

    def run(block, x, xs, n):
        if config.scan_layers:
            return jax.lax.scan(lambda x, xs: block(x, *xs), x, xs)
        outs = []
        for i in range(n):
            x, out = block(x, *jax.tree.map(lambda a, i=i: a[i], xs))
            outs.append(out)
        return x, jax.tree.map(lambda *a: jnp.stack(a), *outs)

    shared = {name: v for name, v in layers.items() if name not in ("mlp", "moe")}
    states, stats = [], []
    for start, stop, kind, first, window in _segments(config):
        p = {**_rows(shared, start, stop), kind: _rows(layers[kind], first, first + stop - start)}
        xs = (p, *_rows((layer_state, keys), start, stop))
        x, (state, layer_stats) = run(block_with(window), x, xs, stop - start)
        states.append(state)
        stats.append(layer_stats)
    if layer_state is not None:
        layer_state = jax.tree.map(lambda *a: jnp.concatenate(a), *states)
    return x, layer_state, stats


def _aux(config: TransformerConfig, stats):
    """The forward's auxiliary outputs from the MoE runs' stacked router statistics."""
    if not stats:
        return {}
    stats = jax.tree.map(lambda *a: jnp.concatenate(a), *stats)
    return {**stats, "loss": moe.aux_loss(stats, config)}


def lm_head_weight(params, config: TransformerConfig):
    """The ``[D, V]`` output projection (the embedding table, transposed, when tied)."""
    w = params["embed"].T if config.tie_embeddings else params["lm_head"]
    return w.astype(config.compute_dtype)


def logits_from_hidden(params, config: TransformerConfig, h):
    """The LM head: float32 logits ``[B, T, V]`` from hidden states, soft-capped by
    ``final_logit_softcap`` (Gemma 2: ``c tanh(z / c)`` keeps every logit in ``(-c, c)``)."""
    logits = jnp.einsum(
        "btd,dv->btv", h, lm_head_weight(params, config), preferred_element_type=jnp.float32
    )
    return with_logical_constraint(soft_cap(logits, config.final_logit_softcap), BTV)


def forward(
    params,
    config: TransformerConfig,
    tokens,
    *,
    positions=None,
    segment_ids=None,
    key=None,
    return_aux: bool = False,
):
    """Next-token logits ``[B, T, V]`` in float32 for ``tokens[B, T]``.

    ``segment_ids[B, T]`` packs several sequences in a row (tokens attend only within their
    segment); ``positions`` default to 0..T-1, restarting per segment when segments are given.
    ``key`` and ``return_aux`` as in :func:`hidden_states`: with ``return_aux`` the result is
    ``(logits, aux)``.
    """
    out = hidden_states(
        params,
        config,
        tokens,
        positions=positions,
        segment_ids=segment_ids,
        key=key,
        return_aux=return_aux,
    )
    if return_aux:
        return logits_from_hidden(params, config, out[0]), out[1]
    return logits_from_hidden(params, config, out)
