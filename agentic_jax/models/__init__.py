"""The transformer substrate: config, parameters, forward pass, attention and HF interop."""
from agentic_jax.models.attention import attention, chunked_attention
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.hf import load_hf_checkpoint, save_hf_checkpoint
from agentic_jax.models.transformer import (flops_per_token, forward, hidden_states, init_params,
                                            lm_head_weight, logits_from_hidden, param_axes,
                                            param_count, param_shapes, segment_positions,
                                            self_attention)

__all__ = [
    "TransformerConfig", "attention", "chunked_attention", "flops_per_token", "forward",
    "hidden_states", "init_params", "lm_head_weight", "load_hf_checkpoint", "logits_from_hidden",
    "param_axes", "param_count", "param_shapes", "save_hf_checkpoint", "segment_positions",
    "self_attention",
]
