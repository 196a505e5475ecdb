"""What compression costs a model: perplexity on held-out text of its float, quantised and
2:4-sparse variants (a bench script's one call)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax

from agentic_jax.models.awq import awq_params
from agentic_jax.models.config import TransformerConfig
from agentic_jax.models.pruning import prune_params
from agentic_jax.models.quantization import quantize_params
from agentic_jax.models.transformer import forward


def perplexity(params, config: TransformerConfig, tokens) -> float:
    """``exp`` of the mean next-token cross-entropy of ``tokens [B, T]`` (each row's last T − 1)."""
    tokens = jnp.asarray(tokens)
    logits = jax.jit(forward, static_argnums=1)(params, config, tokens)
    nll = optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], tokens[:, 1:])
    return math.exp(float(jnp.mean(nll)))


def compressed_variants(
    params, config: TransformerConfig, calibration, *, group_size: int = 64, nf4_block: int = 64
):
    """``{name: parameters}``: the float model, int8 (per channel), int4 (groups of
    ``group_size``) by round-to-nearest and by AWQ, NF4 (absmax blocks of ``nf4_block``: QLoRA's
    64 unless a projection's inputs are no multiple of it), and 2:4 sparsity by magnitude and by
    Wanda; AWQ and Wanda calibrated on ``calibration [B, T]`` tokens."""
    return {
        "float": params,
        "int8": quantize_params(params, config, "int8"),
        "int4": quantize_params(params, config, "int4", group_size=group_size),
        "int4_awq": awq_params(params, config, calibration, "int4", group_size=group_size),
        "nf4": quantize_params(params, config, "nf4", group_size=nf4_block),
        "2:4_magnitude": prune_params(params, config, "magnitude"),
        "2:4_wanda": prune_params(params, config, "wanda", calibration),
    }


def perplexity_deltas(
    params, config: TransformerConfig, tokens, calibration, *, group_size: int = 64
) -> dict[str, dict[str, float]]:
    """``{variant: {"perplexity", "delta"}}`` of :func:`compressed_variants` on ``tokens [B, T]``
    (e.g. ``calibration_tokens(tokenizer, ..., split="heldout")``), ``delta`` the increase over
    the float model's perplexity."""
    variants = compressed_variants(params, config, calibration, group_size=group_size)
    ppl = {name: perplexity(p, config, tokens) for name, p in variants.items()}
    return {name: {"perplexity": v, "delta": v - ppl["float"]} for name, v in ppl.items()}
