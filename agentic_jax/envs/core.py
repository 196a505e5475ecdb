"""The functional environment API: pure `reset` / `step` with auto-reset.

An environment is a stateless Python object; everything that changes lives
in a `flax.struct` state pytree and everything configurable in a params
pytree, so `jax.jit`, `jax.vmap` (over keys *and* params) and `lax.scan`
apply directly. The design follows gymnax (Lange, 2022) and PureJaxRL
(Lu et al., 2022, "Discovered Policy Optimisation", arXiv:2210.05639),
with Gymnasium's split of `done` into `terminated` and `truncated`.

Subclasses implement

    reset_env(key, params) -> (obs, state)
    step_env(key, state, action, params)
        -> (obs, state, reward, terminated, truncated, info)

with no auto-reset, plus `default_params`, `observation_space(params)` and
`action_space(params)`. `Env.reset` / `Env.step` add defaults and the
auto-reset: when `terminated | truncated`, `step` returns the observation
and state of a fresh episode (selected with `jnp.where`, so the shapes are
static) and puts the true last observation in `info["final_observation"]`.

Bootstrapping. `terminated` means the MDP reached an absorbing state: the
value after it is 0, i.e. `discount_t = γ·(1 − terminated_t)`. `truncated`
means the episode was *cut* (a time limit, a budget): the state after it
still has a value, so the learner bootstraps from `V(final_observation)`
(Pardo et al., 2018, "Time Limits in Reinforcement Learning",
arXiv:1712.00378). The observation returned by `step` on a done step is the
*reset* observation and must not be used as the bootstrap. See
`agentic_jax.envs.rollout.bootstrap_inputs`, which folds the truncation
bootstrap into the reward so that `rl.gae` / `rl.lambda_returns` apply as is.
"""

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from agentic_jax.envs import spaces

PyTree = Any


@struct.dataclass
class EnvParams:
    """Params of an environment with nothing to configure (subclass to add fields)."""


@struct.dataclass
class EnvState:
    """Base state: `time` counts the steps taken in the current episode."""

    time: jax.Array


def select_tree(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    """`jnp.where(pred, a, b)` leaf by leaf; `pred` is a scalar (or broadcasts)."""
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


class Env:
    """A pure-functional environment (one instance; `jax.vmap` for batches).

    `step` returns `(obs, state, reward, terminated, truncated, info)` with
    `reward` float32 and `terminated` / `truncated` bool scalars. `info` is a
    dict of arrays whose structure does not depend on the branch taken.
    """

    @property
    def default_params(self) -> PyTree:
        return EnvParams()

    @property
    def name(self) -> str:
        return type(self).__name__

    def reset(self, key: jax.Array, params: PyTree | None = None) -> tuple[PyTree, PyTree]:
        """The first observation and state of an episode."""
        return self.reset_env(key, self.default_params if params is None else params)

    def step(self, key: jax.Array, state: PyTree, action: PyTree, params: PyTree | None = None):
        """One step with auto-reset; `info["final_observation"]` is the true next observation."""
        params = self.default_params if params is None else params
        key_step, key_reset = jax.random.split(key)
        obs, next_state, reward, terminated, truncated, info = self.step_env(
            key_step, state, action, params
        )
        reset_obs, reset_state = self.reset_env(key_reset, params)
        terminated, truncated = jnp.asarray(terminated, bool), jnp.asarray(truncated, bool)
        done = terminated | truncated
        info = {**info, "final_observation": obs}
        return (
            select_tree(done, reset_obs, obs),
            select_tree(done, reset_state, next_state),
            jnp.asarray(reward, jnp.float32),
            terminated,
            truncated,
            info,
        )

    def reset_env(self, key: jax.Array, params: PyTree) -> tuple[PyTree, PyTree]:
        raise NotImplementedError

    def step_env(self, key: jax.Array, state: PyTree, action: PyTree, params: PyTree):
        raise NotImplementedError

    def observation_space(self, params: PyTree | None = None) -> spaces.Space:
        raise NotImplementedError

    def action_space(self, params: PyTree | None = None) -> spaces.Space:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{self.name}()"
