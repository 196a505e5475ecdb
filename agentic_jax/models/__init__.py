"""The transformer substrate: config, parameters, forward pass, attention, HF interop, and
loading and saving models and checkpoints."""

from agentic_jax.models.attention import attention, chunked_attention
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.export import load_checkpoint, load_model, save_model
from agentic_jax.models.hf import load_hf_checkpoint, save_hf_checkpoint
from agentic_jax.models.transformer import (
    flops_per_token,
    forward,
    hidden_states,
    init_params,
    lm_head_weight,
    logits_from_hidden,
    param_axes,
    param_count,
    param_shapes,
    segment_positions,
    self_attention,
)

__all__ = [
    "TransformerConfig",
    "attention",
    "chunked_attention",
    "flops_per_token",
    "forward",
    "hidden_states",
    "init_params",
    "lm_head_weight",
    "load_checkpoint",
    "load_hf_checkpoint",
    "load_model",
    "logits_from_hidden",
    "param_axes",
    "param_count",
    "param_shapes",
    "save_hf_checkpoint",
    "save_model",
    "segment_positions",
    "self_attention",
]
