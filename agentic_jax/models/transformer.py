"""The decoder-only transformer as pure functions over a parameter pytree.

Pre-norm residual blocks (RMSNorm -> attention with RoPE -> residual; RMSNorm -> SwiGLU MLP ->
residual) stacked on a leading ``layers`` axis and run with ``jax.lax.scan``; final RMSNorm and an
LM head tied to the embedding or separate.  This is the Llama / Mistral / Qwen2 architecture.

Every parameter has a tuple of logical axis names (:func:`param_axes`), and activations are
constrained at block boundaries by logical name; :mod:`sharding` alone maps names to mesh axes.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.models.attention import attention
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.rope import apply_rope, rope_tables
from sharding import with_logical_constraint
from sharding.names import BTD, BTF, BTKH, BTNH, BTV


class ParamSpec(NamedTuple):
    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: str  # "normal:<std>" | "ones" | "zeros"


def _specs(c: TransformerConfig) -> dict:
    """The single table of parameter shapes, logical axes and initialisers."""
    L, D, N, K, H, F, V = (
        c.n_layers,
        c.d_model,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.d_ff,
        c.vocab_size,
    )
    std, out_std = c.init_std, c.init_std / math.sqrt(2 * L)
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
    specs = {
        "embed": ParamSpec((V, D), ("vocab", "embed"), f"normal:{std}"),
        "layers": {
            "attn_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
            "attn": attn,
            "mlp_norm": ParamSpec((L, D), ("layers", "norm"), "ones"),
            "mlp": {
                "gate": ParamSpec((L, D, F), ("layers", "embed", "mlp"), f"normal:{std}"),
                "up": ParamSpec((L, D, F), ("layers", "embed", "mlp"), f"normal:{std}"),
                "down": ParamSpec((L, F, D), ("layers", "mlp", "embed"), f"normal:{out_std}"),
            },
        },
        "final_norm": ParamSpec((D,), ("norm",), "ones"),
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


def param_count(config: TransformerConfig) -> int:
    leaves = jax.tree.leaves(_specs(config), is_leaf=_is_spec)
    return sum(math.prod(s.shape) for s in leaves)


def flops_per_token(
    config: TransformerConfig, seq_len: int, *, causal: bool = True, training: bool = True
) -> float:
    """Model FLOPs per token (Kaplan et al. 2020; PaLM, Chowdhery et al. 2022, appendix B).

    ``6 N + 12 L n_heads head_dim T`` for training (forward = a third of it), where N counts the
    parameters used in matmuls (the embedding lookup is free; a tied table is used once as the LM
    head) and the attention term is halved for causal masks, whose upper triangle is skipped.
    """
    n_matmul = param_count(config) - (
        0 if config.tie_embeddings else config.vocab_size * config.d_model
    )
    attn = 12 * config.n_layers * config.n_heads * config.head_dim * seq_len
    if causal:
        attn /= 2
    total = 6 * n_matmul + attn
    return total if training else total / 3


def rms_norm(x, weight, eps):
    """RMSNorm (Zhang & Sennrich 2019): x / sqrt(mean(x^2) + eps) * weight, in float32."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (normed * weight.astype(jnp.float32)).astype(x.dtype)


def segment_positions(segment_ids):
    """Positions restarting at 0 at the start of every segment of a packed row."""
    idx = jnp.arange(segment_ids.shape[-1])
    starts = jnp.concatenate(
        [jnp.ones_like(segment_ids[..., :1], bool), segment_ids[..., 1:] != segment_ids[..., :-1]],
        axis=-1,
    )
    return idx - jax.lax.cummax(jnp.where(starts, idx, 0), axis=segment_ids.ndim - 1)


def self_attention(config: TransformerConfig, segment_ids):
    """The training/prefill ``attend``: causal self-attention within segments, no state."""
    seg = None if segment_ids is None else (segment_ids, segment_ids)

    def attend(q, k, v, state):
        o = attention(
            q,
            k,
            v,
            causal=True,
            segment_ids=seg,
            sliding_window=config.sliding_window,
            implementation=config.attention_impl,
            chunk_size=config.attention_chunk_size,
        )
        return o, state

    return attend


def _dense(eq, x, w, name, lora, dropout):
    """``einsum(eq, x, w)``, plus LoRA's low-rank path ``dropout(x) · A · B`` when the layer carries
    an adapter ``lora[name] = {"a": [in..., r], "b": [r, out...]}`` for this projection (the α/r
    scale is already folded into B; see :mod:`agentic_jax.models.lora`)."""
    y = jnp.einsum(eq, x, w)
    if name not in lora:
        return y
    if dropout is not None:  # {"rate": [], "key": {name: key}}
        keep = 1.0 - dropout["rate"]
        x = jnp.where(
            jax.random.bernoulli(dropout["key"][name], keep, x.shape), x / keep, 0
        ).astype(x.dtype)
    a, b = lora[name]["a"], lora[name]["b"]
    return y + jnp.tensordot(jnp.tensordot(x, a, a.ndim - 1), b, 1)


def _block(config: TransformerConfig, p, x, cos, sin, attend, state):
    """One pre-norm residual block on ``x[B,T,D]``; ``p`` holds this layer's parameters.

    ``attend(q, k, v, state) -> (o, state)`` is where decoders plug in a KV cache: ``state`` is
    this layer's slice of whatever per-layer state the caller threads through the layers.
    LoRA adapters, when present, are ``p["lora"]``, with dropout keys in ``p["lora_dropout"]``.
    """
    dtype = config.compute_dtype
    p = dict(p)
    dropout = p.pop("lora_dropout", None)  # PRNG keys take no dtype cast
    p = jax.tree.map(lambda a: a.astype(dtype), p)
    a, m = p["attn"], p["mlp"]
    dense = functools.partial(_dense, lora=p.get("lora", {}), dropout=dropout)
    h = rms_norm(x, p["attn_norm"], config.norm_eps)
    q = dense("btd,dnh->btnh", h, a["q"], "q")
    k = dense("btd,dkh->btkh", h, a["k"], "k")
    v = dense("btd,dkh->btkh", h, a["v"], "v")
    if config.qkv_bias:
        q, k, v = q + a["q_bias"], k + a["k_bias"], v + a["v_bias"]
    q = with_logical_constraint(apply_rope(q, cos, sin), BTNH)
    k = with_logical_constraint(apply_rope(k, cos, sin), BTKH)
    v = with_logical_constraint(v, BTKH)
    o, state = attend(q, k, v, state)
    x = with_logical_constraint(x + dense("btnh,nhd->btd", o, a["o"], "o"), BTD)
    h = rms_norm(x, p["mlp_norm"], config.norm_eps)
    hidden = jax.nn.silu(dense("btd,df->btf", h, m["gate"], "gate")) * dense(
        "btd,df->btf", h, m["up"], "up"
    )
    hidden = with_logical_constraint(hidden, BTF)
    return with_logical_constraint(x + dense("btf,fd->btd", hidden, m["down"], "down"), BTD), state


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


def hidden_states(
    params,
    config: TransformerConfig,
    tokens,
    *,
    positions=None,
    segment_ids=None,
    attend=None,
    layer_state=None,
):
    """Final-norm hidden states ``[B, T, D]`` (the LM head's input).

    Decoders pass ``attend`` (see :func:`_block`) and ``layer_state``, a pytree whose leaves have a
    leading ``n_layers`` axis (a KV cache); the result is then ``(hidden, new_layer_state)``.
    """
    _check_tokens(config, tokens, positions, segment_ids)
    if positions is None:
        positions = (
            segment_positions(segment_ids)
            if segment_ids is not None
            else jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        )
    x = jnp.take(params["embed"], tokens, axis=0).astype(config.compute_dtype)
    x = with_logical_constraint(x, BTD)
    cos, sin = rope_tables(config, positions)
    stateful = attend is not None
    attend = attend or self_attention(config, segment_ids)

    def block(x, p, state):
        return _block(config, p, x, cos, sin, attend, state)

    if config.remat_policy != "none":
        block = jax.checkpoint(block, policy=_REMAT[config.remat_policy])
    if config.scan_layers:
        x, layer_state = jax.lax.scan(
            lambda x, ps: block(x, *ps), x, (params["layers"], layer_state)
        )
    else:
        states = []
        for i in range(config.n_layers):
            x, st = block(x, *jax.tree.map(lambda a, i=i: a[i], (params["layers"], layer_state)))
            states.append(st)
        layer_state = (
            jax.tree.map(lambda *a: jnp.stack(a), *states) if states[0] is not None else None
        )
    h = rms_norm(x, params["final_norm"].astype(config.compute_dtype), config.norm_eps)
    return (h, layer_state) if stateful else h


def lm_head_weight(params, config: TransformerConfig):
    """The ``[D, V]`` output projection (the embedding table, transposed, when tied)."""
    w = params["embed"].T if config.tie_embeddings else params["lm_head"]
    return w.astype(config.compute_dtype)


def logits_from_hidden(params, config: TransformerConfig, h):
    """The LM head: float32 logits ``[B, T, V]`` from hidden states."""
    logits = jnp.einsum(
        "btd,dv->btv", h, lm_head_weight(params, config), preferred_element_type=jnp.float32
    )
    return with_logical_constraint(logits, BTV)


def forward(params, config: TransformerConfig, tokens, *, positions=None, segment_ids=None):
    """Next-token logits ``[B, T, V]`` in float32 for ``tokens[B, T]``.

    ``segment_ids[B, T]`` packs several sequences in a row (tokens attend only within their
    segment); ``positions`` default to 0..T-1, restarting per segment when segments are given.
    """
    h = hidden_states(params, config, tokens, positions=positions, segment_ids=segment_ids)
    return logits_from_hidden(params, config, h)
