"""Multi-armed Bernoulli bandit: the simplest task with a known optimum.

Every step is a one-step episode: the agent pulls arm `a` and gets reward 1
with probability `probs[a]`, else 0, then the episode terminates. The
observation is a constant, so the optimal policy always pulls
`argmax(probs)` and its expected return is `max(probs)`.
Robbins (1952); Sutton & Barto (2018), ch. 2.
"""

import jax
import jax.numpy as jnp
from flax import struct

from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env, EnvState


@struct.dataclass
class BanditParams:
    probs: jax.Array


class BernoulliBandit(Env):
    """`num_arms` Bernoulli arms; `params.probs` may be vmapped for a family of bandits."""

    def __init__(self, probs=(0.2, 0.5, 0.8, 0.35)):
        self.probs = jnp.asarray(probs, jnp.float32)
        self.num_arms = int(self.probs.shape[0])

    @property
    def default_params(self):
        return BanditParams(self.probs)

    def reset_env(self, key, params):
        return jnp.zeros((1,), jnp.float32), EnvState(jnp.int32(0))

    def step_env(self, key, state, action, params):
        reward = jax.random.bernoulli(key, params.probs[action]).astype(jnp.float32)
        return (
            jnp.zeros((1,), jnp.float32),
            EnvState(state.time + 1),
            reward,
            jnp.bool_(True),
            jnp.bool_(False),
            {},
        )

    def observation_space(self, params=None):
        return spaces.Box(0.0, 0.0, (1,))

    def action_space(self, params=None):
        return spaces.Discrete(self.num_arms)


def optimal_return(params: BanditParams) -> jax.Array:
    """Expected reward of the best arm."""
    return jnp.max(params.probs)
