"""KL-coefficient controllers, as pure (init, update) pairs in the style of optax.

The state is just the coefficient, so it can live in a jitted train state and
be checkpointed with it.
"""

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check


class KLController(NamedTuple):
    """`init() -> coef`; `update(coef, current_kl, n_steps) -> new coef`."""

    init: Callable[[], jax.Array]
    update: Callable[[jax.Array, jax.Array, jax.Array], jax.Array]


def fixed_kl_controller(kl_coef: float) -> KLController:
    """A constant coefficient β (the GRPO / DeepSeekMath setting)."""
    check.static_range("kl_coef", kl_coef, 0.0, float("inf"))
    return KLController(
        init=lambda: jnp.float32(kl_coef), update=lambda coef, current_kl, n_steps: coef
    )


def adaptive_kl_controller(init_kl_coef: float, target_kl: float, horizon: float) -> KLController:
    """Proportional control of β towards a target KL (Ziegler et al. 2019, arXiv:1909.08593).

    e = clip(KL / KL_target − 1, −0.2, 0.2);  β ← β·(1 + e·n_steps / horizon).
    The clip keeps one noisy KL estimate from moving β by more than
    20%·n_steps/horizon.
    """
    check.static_range("init_kl_coef", init_kl_coef, 0.0, float("inf"))
    check.static_range("target_kl", target_kl, 0.0, float("inf"), low_open=True)
    check.static_range("horizon", horizon, 0.0, float("inf"), low_open=True)

    def update(coef, current_kl, n_steps):
        error = jnp.clip(jnp.asarray(current_kl, jnp.float32) / target_kl - 1.0, -0.2, 0.2)
        return coef * (1.0 + error * n_steps / horizon)

    return KLController(init=lambda: jnp.float32(init_kl_coef), update=update)
