"""Dynamic loss scaling for float16 compute (Micikevicius et al. 2018, "Mixed precision training").

Float16 flushes gradients below ``2^-24`` to zero. The loss is multiplied by a scale ``S`` before
differentiation, so the backward pass carries ``S dL/dx``, and the gradients are divided by ``S``
(in float32) before the optimiser. If any gradient is then inf or NaN the step is skipped
(parameters and optimiser state stay as they were) and ``S`` is halved; after
``growth_interval`` finite steps in a row ``S`` doubles. ``training.make_update`` does this when
it is given a :class:`DynamicLossScale`; the scale's state is ``TrainState.loss_scale``.
(``optax.apply_if_finite`` skips non-finite updates too, but keeps no scale: the one finite flag
here drives both the skip and the scale.)
"""

from __future__ import annotations

import dataclasses

import flax.struct
import gin
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class LossScaleState:
    scale: jax.Array  # float32 scalar: the loss is multiplied by it
    good_steps: jax.Array  # int32 scalar: finite steps since the scale last changed


@gin.configurable
@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """Starts at ``init_scale``; each non-finite step halves it (``/ factor``, not below
    ``min_scale``), each ``growth_interval``-th finite step in a row doubles it (``* factor``,
    not above ``max_scale``)."""

    init_scale: float = 2.0**15
    growth_interval: int = 2000
    factor: float = 2.0
    min_scale: float = 1.0
    max_scale: float = 2.0**24

    def __post_init__(self):
        if self.growth_interval < 1:
            raise ValueError(
                f"DynamicLossScale.growth_interval must be >= 1, got {self.growth_interval}"
            )
        if not self.factor > 1:
            raise ValueError(f"DynamicLossScale.factor must be > 1, got {self.factor}")
        if not 0 < self.min_scale <= self.init_scale <= self.max_scale:
            raise ValueError(
                "DynamicLossScale needs 0 < min_scale <= init_scale <= max_scale; got "
                f"{self.min_scale}, {self.init_scale}, {self.max_scale}"
            )

    def init(self) -> LossScaleState:
        return LossScaleState(jnp.float32(self.init_scale), jnp.int32(0))

    def adjust(self, state: LossScaleState, finite) -> LossScaleState:
        """The state after a step whose unscaled gradients were all finite (``finite``) or not."""
        good = jnp.where(finite, state.good_steps + 1, 0)
        grow = good >= self.growth_interval
        scale = jnp.where(
            finite,
            jnp.where(grow, jnp.minimum(state.scale * self.factor, self.max_scale), state.scale),
            jnp.maximum(state.scale / self.factor, self.min_scale),
        )
        return LossScaleState(scale.astype(jnp.float32), jnp.where(grow, 0, good).astype(jnp.int32))


def all_finite(tree):
    """True when every element of every array in ``tree`` is finite."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def keep_if_finite(config: DynamicLossScale, state, grads, params, opt_state):
    """``(state, params, opt_state, metrics)`` of a loss-scaled step: the new ``params`` and
    ``opt_state`` if every unscaled gradient in ``grads`` is finite, else ``state``'s own (the
    step is skipped); ``state.loss_scale`` adjusted; the metrics ``loss_scale`` (the scale this
    step used) and ``skipped`` (1 for a skipped step)."""
    finite = all_finite(grads)
    params, opt_state = optax.tree.where(
        finite, (params, opt_state), (state.params, state.opt_state)
    )
    metrics = {"loss_scale": state.loss_scale.scale, "skipped": 1 - finite.astype(jnp.int32)}
    state = state.replace(loss_scale=config.adjust(state.loss_scale, finite))
    return state, params, opt_state, metrics
