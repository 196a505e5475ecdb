"""Decoding: generating tokens from a trained model."""
from agentic_jax.inference.recompute import generate_recompute

__all__ = ["generate_recompute"]
