"""Decoding: generating tokens from a trained model."""
from agentic_jax.inference.recompute import generate_recompute
from agentic_jax.inference.sampling import (Sample, SamplingArrays, SamplingParams, add_tokens,
                                            count_tokens, filtered_logits, sample)

__all__ = ["Sample", "SamplingArrays", "SamplingParams", "add_tokens", "count_tokens",
           "filtered_logits", "generate_recompute", "sample"]
