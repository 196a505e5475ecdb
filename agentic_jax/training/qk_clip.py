"""QK-Clip, the "Clip" of MuonClip (Kimi Team 2025, "Kimi K2: open agentic intelligence").

Muon's updates have a larger effective rank than AdamW's, and Kimi K2 saw attention logits
grow without bound during training: a head whose largest logit runs away saturates its softmax
(and, in their runs, the loss spiked).  QK-Clip caps each head's largest pre-softmax logit at
``tau`` after the optimiser step, by rescaling the projections that make it.  With
``S_h = max over the batch of sm_scale q_h . k_h`` measured in this step's forward pass and
``gamma_h = min(1, tau / S_h)``, head ``h``'s query and key projections are scaled by
``sqrt(gamma_h)`` each, so its logits scale by ``gamma_h`` (RoPE is linear, and a bias is
scaled with its weight); heads under ``tau`` are left exactly as they are.

Grouped-query attention shares one key projection among the ``G`` query heads of a group.  The
shared key is scaled by ``sqrt(gamma_g)`` with ``gamma_g`` the smallest ``gamma_h`` of its group,
and each query head by ``gamma_h / sqrt(gamma_g)``: every head's logits still scale by exactly
its own ``gamma_h`` (1 for a head under ``tau``), and with ``G = 1`` this is Kimi's rule.

Multi-head latent attention (``attention_type="mla"``, Kimi K2's own attention) scores
``q^C_h . k^C_h + q^R_h . k^R`` with a per-head no-position query and key (``q``/``q_b``'s first
``d_nope`` columns of head ``h`` and ``k_up``'s head ``h``), a per-head rotary query (the rest
of those columns) and one rotary key ``k^R`` shared by every head (``kv_a``'s last columns).
Kimi K2's rule (arXiv 2507.20534, §2.1): ``q^C_h`` and ``k^C_h`` are scaled by
``sqrt(gamma_h)`` each and ``q^R_h`` by ``gamma_h``; ``k^R`` is left alone (scaling it would move
every head), so both parts of head ``h``'s logits scale by exactly ``gamma_h``.

The statistic comes out of the forward pass itself: :func:`hidden_states_with_max_logits` runs
the model with an ``attend`` that also returns each layer's per-head maximum, threaded through
the layer scan as the per-layer state (the hook decoders use for their KV cache).  Under MLA the
hook sees the training path's per-head queries and keys, with the queries already carrying the
softmax scale MLA applies (``mla_softmax_factor`` included), so ``S_h`` is the true logit.
"""

from __future__ import annotations

import jax.numpy as jnp

from agentic_jax.models import TransformerConfig, hidden_states, self_attention
from agentic_jax.models.attention import max_attention_logits


def hidden_states_with_max_logits(
    params, config: TransformerConfig, tokens, *, positions=None, segment_ids=None, key=None
):
    """``(hidden [B, T, D], max_logits [n_layers, n_heads], aux)``: the model's final hidden
    states, each layer's per-head largest attention logit (outside the gradient) and the
    auxiliary outputs of ``hidden_states(..., return_aux=True)`` (a mixture of experts' loss and
    router statistics, computed as in training: ``key`` draws router noise, tokens over
    capacity are dropped)."""
    attend = self_attention(config, segment_ids)
    seg = None if segment_ids is None else (segment_ids, segment_ids)

    def recording(q, k, v, state, window):
        del state
        o, _ = attend(q, k, v, None, window)
        return o, max_attention_logits(q, k, causal=True, segment_ids=seg, sliding_window=window)

    return hidden_states(
        params,
        config,
        tokens,
        positions=positions,
        segment_ids=segment_ids,
        attend=recording,
        layer_state=jnp.zeros((config.n_layers, config.n_heads), jnp.float32),
        key=key,
        return_aux=True,
        dropless=False,
        absorbed=False,
    )


def qk_clip(params, max_logits, threshold: float):
    """``params`` with the query and key projections of every head whose ``max_logits``
    ``[n_layers, n_heads]`` exceed ``threshold`` rescaled so that those logits become
    ``threshold`` (see the module docstring); every other parameter is returned unchanged."""
    if not threshold > 0:
        raise ValueError(f"QK-Clip threshold must be positive, got {threshold}")
    attn = dict(params["layers"]["attn"])
    q = attn.get("q_b", attn.get("q"))
    if max_logits.shape != q.shape[:1] + q.shape[2:3]:
        raise ValueError(
            f"max_logits has shape {max_logits.shape}; the model's attention has "
            f"[n_layers, n_heads] = {q.shape[:1] + q.shape[2:3]}"
        )
    gamma = jnp.where(max_logits > threshold, threshold / max_logits, 1.0)
    clip = _clip_mla if "k_up" in attn else _clip_gqa
    return {**params, "layers": {**params["layers"], "attn": clip(attn, gamma)}}


def _scaled(w, scale):
    """``w [L, in, N, H]`` times ``scale [L, N]`` or ``[L, N, H]``, in ``w``'s dtype."""
    scale = scale if scale.ndim == 3 else scale[..., None]
    return w * scale[:, None].astype(w.dtype)


def _clip_gqa(attn, gamma):
    """Grouped-query attention's projections (and biases) for per-head factors ``gamma``."""
    n_layers, n_heads = gamma.shape
    kv_heads = attn["k"].shape[2]
    gamma_kv = gamma.reshape(n_layers, kv_heads, n_heads // kv_heads).min(-1)
    key_scale = jnp.sqrt(gamma_kv)  # [L, K]
    query_scale = gamma / jnp.repeat(key_scale, n_heads // kv_heads, axis=1)  # [L, N]
    for name, scale in (("q", query_scale), ("k", key_scale)):
        attn[name] = _scaled(attn[name], scale)
        if f"{name}_bias" in attn:
            bias = attn[f"{name}_bias"]
            attn[f"{name}_bias"] = bias * scale[:, :, None].astype(bias.dtype)
    return attn


def _clip_mla(attn, gamma):
    """Multi-head latent attention's projections for per-head factors ``gamma`` (Kimi K2's
    rule, see the module docstring): ``sqrt(gamma)`` on the no-position query columns and on
    ``k_up``, ``gamma`` on the rotary query columns, the shared rotary key untouched."""
    q_name = "q_b" if "q_b" in attn else "q"
    d_nope, qk = attn["k_up"].shape[-1], attn[q_name].shape[-1]  # qk = d_nope + d_rope
    root = jnp.sqrt(gamma)
    query_scale = jnp.where(jnp.arange(qk) < d_nope, root[..., None], gamma[..., None])  # [L,N,qk]
    attn[q_name] = _scaled(attn[q_name], query_scale)
    attn["k_up"] = _scaled(attn["k_up"], root)
    return attn
