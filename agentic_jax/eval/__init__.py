"""Evaluation: metrics and statistics with outside references (this package imports no other
project package but ``data``); ``eval.suites`` plays agents on task suites above it."""

from agentic_jax.eval.metrics import bootstrap_ci, hierarchical_bootstrap_ci, pass_at_k, pass_hat_k

__all__ = ["bootstrap_ci", "hierarchical_bootstrap_ci", "pass_at_k", "pass_hat_k"]
