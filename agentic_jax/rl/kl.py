"""Per-token estimators of KL(π ‖ π_ref) from tokens sampled from π.

The KL term can sit in two places: in the reward (per token, detached, as in
InstructGPT-style PPO: `kl_penalized_rewards`) or in the loss (differentiated,
as in GRPO: `policy_loss(..., ref_logp=..., kl_coef=...)`).
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.numerics import LOG_RATIO_CLAMP

KL_ESTIMATORS = ("k1", "k2", "k3", "abs", "k1+", "k3+")


def _k3(x):
    """e^{−x} − 1 + x without cancellation: ≥ 0 in float32, and > 0 for tiny x ≠ 0.

    x is floored at −20 in both terms (e^{−x} overflows below): the value is constant there and
    the gradient 0. Flooring only the exponential would leave the gradient +1, which pushes
    log π further below log π_ref, and the value negative below x ≈ −e^20.
    """
    x_floored = jnp.maximum(x, -LOG_RATIO_CLAMP)
    small = jnp.abs(x) < 1e-3
    series = jnp.square(x) * (0.5 - x / 6.0 + jnp.square(x) / 24.0)
    return jnp.where(small, series, jnp.expm1(-x_floored) + x_floored)


def kl_penalty(logp, ref_logp, kind: str = "k3", *, clamp: float | None = None) -> jax.Array:
    """Per-token KL estimates, same shape as `logp`.

    With x = log π(y) − log π_ref(y) at the sampled token y ~ π:
      k1  = x                     unbiased, high variance, can be negative
      k2  = x² / 2                biased, low variance, ≥ 0
      k3  = e^{−x} − 1 + x         unbiased and ≥ 0 (low-variance, "low_var_kl")
      abs = |x|
      k1+ = value of k1, gradient of k2;  k3+ = value of k3, gradient of k2.
    The gradient of k2, x·∇log π, is an unbiased estimate of ∇KL(π‖π_ref), which
    the gradients of k1 and k3 are not; the straight-through "+" variants log
    the unbiased value while following the right gradient.
    `clamp` bounds the value to [−clamp, clamp] (not the "+" gradient).
    Schulman (2020), "Approximating KL divergence", joschu.net/blog/kl-approx.html.
    """
    check.choice("kind", kind, KL_ESTIMATORS)
    logp = check.floating("logp", logp)
    ref_logp = check.shape("ref_logp", check.floating("ref_logp", ref_logp), logp.shape)
    if clamp is not None:
        check.static_range("clamp", clamp, 0.0, float("inf"), low_open=True)
    x = logp - ref_logp
    k2 = 0.5 * jnp.square(x)
    estimates = {
        "k1": lambda: x,
        "k2": lambda: k2,
        "k3": lambda: _k3(x),
        "abs": lambda: jnp.abs(x),
    }
    value = estimates[kind.rstrip("+")]()
    if clamp is not None:
        value = jnp.clip(value, -clamp, clamp)
    if kind.endswith("+"):
        return jax.lax.stop_gradient(value) + k2 - jax.lax.stop_gradient(k2)
    return value


def kl_penalized_rewards(
    rewards, logp, ref_logp, mask, *, kl_coef, kind: str = "k1", clamp=None
) -> jax.Array:
    """r_t − β·KL_t on valid tokens: the KL placed in the reward (Ziegler et al. 2019).

    The penalty is detached: it shapes the return that advantages are computed
    from, it is not a loss term. `logp` are the rollout (old-policy) log-probs.
    Ziegler et al. (2019), "Fine-Tuning LMs from Human Preferences", arXiv:1909.08593.
    """
    rewards = check.floating("rewards", rewards)
    mask = check.shape("mask", check.mask("mask", mask), rewards.shape)
    kl = check.shape("logp", kl_penalty(logp, ref_logp, kind, clamp=clamp), rewards.shape)
    return rewards - kl_coef * jax.lax.stop_gradient(kl) * mask
