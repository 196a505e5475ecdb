"""The complete training state: everything a restart needs to continue bit-for-bit."""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import optax

from agentic_jax.training.loss_scale import DynamicLossScale, LossScaleState


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimiser updates applied so far
    params: dict
    opt_state: optax.OptState
    rng: jax.Array  # raw uint32 key data (checkpoints store plain arrays)
    loss_scale: LossScaleState | None = None  # float16's dynamic loss scale (``loss_scale.py``)

    @classmethod
    def create(
        cls,
        params,
        optimizer: optax.GradientTransformation,
        seed: int,
        loss_scale: DynamicLossScale | None = None,
    ) -> TrainState:
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            rng=jax.random.key_data(jax.random.key(seed)),
            loss_scale=None if loss_scale is None else loss_scale.init(),
        )

    def step_key(self):
        """A fresh typed key for this step (dropout, sampling) derived from the stored RNG."""
        return jax.random.fold_in(jax.random.wrap_key_data(self.rng), self.step)
