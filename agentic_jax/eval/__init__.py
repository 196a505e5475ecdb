"""Evaluation: metrics of sampled solutions and their confidence intervals."""

from agentic_jax.eval.metrics import bootstrap_ci, hierarchical_bootstrap_ci, pass_at_k

__all__ = ["bootstrap_ci", "hierarchical_bootstrap_ci", "pass_at_k"]
