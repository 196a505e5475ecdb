"""Numerically safe primitives used across the losses.

Log-probabilities of whole sequences reach -1e4 and beyond; ratios of such
numbers overflow `exp` in float32 (which saturates near e^88). Every `exp` of
a log-ratio in this package therefore goes through `clamped_exp`.
"""

import jax
import jax.numpy as jnp

LOG_RATIO_CLAMP = 20.0
"""Log-ratios are clamped to [-20, 20] before `exp` (ratios within e^±20)."""

EXP_CAP = 50.0
"""Upper bound on exponents of non-ratio terms (e.g. DiscoPOP's e^{-x})."""


def clamped_exp(x: jax.Array, bound: float = LOG_RATIO_CLAMP) -> jax.Array:
    """exp(clip(x, -bound, bound)): finite in float32 for any finite input."""
    return jnp.exp(jnp.clip(x, -bound, bound))


def log1mexp(x: jax.Array, max_value: float = -1e-6) -> jax.Array:
    """log(1 - e^x) for x < 0, accurate at both ends (Mächler, 2012).

    `x` is clamped to `max_value` so that log-probabilities at (or rounding to)
    zero stay finite, in value and in gradient; each branch only ever sees
    inputs where it is finite, so `where` does not leak NaN gradients.
    """
    x = jnp.minimum(x, max_value)
    near_zero = x > -jnp.log(2.0)
    small = jnp.log(-jnp.expm1(jnp.where(near_zero, x, -1.0)))
    large = jnp.log1p(-jnp.exp(jnp.where(near_zero, -1.0, x)))
    return jnp.where(near_zero, small, large)


def expectation(log_p: jax.Array, x: jax.Array) -> jax.Array:
    """Σ_v p_v·x_v over the last axis, p = e^{log_p}, the entries with p_v = 0 left out.

    There (a logit at −inf: a masked action or vocabulary entry) x_v is often infinite (log p_v,
    or log p_v − log q_v), and 0·inf is NaN in the value and the gradient; they contribute 0
    instead, the limit 0·log 0 = 0.  Entropy is −expectation(log p, log p), KL(p‖q) is
    expectation(log p, log p − log q).
    """
    p = jnp.exp(log_p)
    return jnp.sum(p * jnp.where(p > 0, x, 0.0), axis=-1)


def safe_div(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator, and 0 where the denominator is not positive (empty masks)."""
    positive = denominator > 0
    return jnp.where(positive, numerator / jnp.where(positive, denominator, 1.0), 0.0)
