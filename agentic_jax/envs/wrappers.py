"""Wrappers: time limit, observation / reward transforms, episode statistics, vmap.

Two kinds, by where they sit relative to the auto-reset:

* `Wrapper` subclasses change `reset_env` / `step_env`, so they act *inside*
  the auto-reset of `Env.step`: `TimeLimit`, `TransformObservation`,
  `TransformReward`. Their state is reset with the episode, and
  `info["final_observation"]` is the wrapped (transformed) observation.
* `OuterWrapper` subclasses change `reset` / `step`, so they act *outside*
  it and their state survives episode ends: `EpisodeStatistics`,
  `Vectorized`. Put them outermost; an inner wrapper around one raises.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env, PyTree


class Wrapper(Env):
    """Delegates every method to `env`; subclasses override what they change."""

    def __init__(self, env: Env):
        self.env = env

    @property
    def default_params(self):
        return self.env.default_params

    @property
    def name(self) -> str:
        return f"{type(self).__name__}[{self.env.name}]"

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped if isinstance(self.env, Wrapper) else self.env

    def reset_env(self, key, params):
        return self.env.reset_env(key, params)

    def step_env(self, key, state, action, params):
        return self.env.step_env(key, state, action, params)

    def observation_space(self, params=None):
        return self.env.observation_space(params)

    def action_space(self, params=None):
        return self.env.action_space(params)

    def __repr__(self) -> str:
        return self.name


@struct.dataclass
class TimeLimitState:
    env_state: PyTree
    time: jax.Array


class TimeLimit(Wrapper):
    """Sets `truncated` once an episode has run `max_steps` steps.

    `truncated` is set only where the step did not also terminate, so the
    two flags are exclusive and a learner bootstraps on `truncated` alone.
    """

    def __init__(self, env: Env, max_steps: int):
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        super().__init__(env)
        self.max_steps = int(max_steps)

    def reset_env(self, key, params):
        obs, state = self.env.reset_env(key, params)
        return obs, TimeLimitState(state, jnp.int32(0))

    def step_env(self, key, state, action, params):
        obs, env_state, reward, terminated, truncated, info = self.env.step_env(
            key, state.env_state, action, params
        )
        time = state.time + 1
        truncated = (jnp.asarray(truncated, bool) | (time >= self.max_steps)) & ~jnp.asarray(
            terminated, bool
        )
        return obs, TimeLimitState(env_state, time), reward, terminated, truncated, info


class TransformObservation(Wrapper):
    """Applies `fn(obs)` to every observation; pass the new space if it changes."""

    def __init__(self, env: Env, fn: Callable, observation_space: spaces.Space | None = None):
        super().__init__(env)
        self.fn, self._space = fn, observation_space

    def reset_env(self, key, params):
        obs, state = self.env.reset_env(key, params)
        return self.fn(obs), state

    def step_env(self, key, state, action, params):
        obs, *rest = self.env.step_env(key, state, action, params)
        return (self.fn(obs), *rest)

    def observation_space(self, params=None):
        return self.env.observation_space(params) if self._space is None else self._space


class TransformReward(Wrapper):
    """Applies `fn(reward)` to every reward (scaling, clipping, shaping)."""

    def __init__(self, env: Env, fn: Callable):
        super().__init__(env)
        self.fn = fn

    def step_env(self, key, state, action, params):
        obs, state, reward, *rest = self.env.step_env(key, state, action, params)
        return (obs, state, self.fn(reward), *rest)


class OuterWrapper(Wrapper):
    """A wrapper over the auto-resetting `reset` / `step`; it must be outermost."""

    def reset_env(self, key, params):
        raise TypeError(
            f"{type(self).__name__} wraps the auto-reset; apply it outside every other wrapper"
        )

    step_env = reset_env


@struct.dataclass
class EpisodeStatisticsState:
    env_state: PyTree
    episode_return: jax.Array
    episode_length: jax.Array
    last_return: jax.Array
    last_length: jax.Array


class EpisodeStatistics(OuterWrapper):
    """Running episode return and length, across auto-resets.

    Adds to `info`: "episode_done" (an episode ended at this step), and
    "episode_return" / "episode_length" of the last *completed* episode
    (at a done step: the one that just ended). Average the returns of
    finished episodes with `where=info["episode_done"]`.
    """

    def __init__(self, env: Env):
        if isinstance(env, Vectorized):  # its scalar counters would turn into [N] ones after a step
            raise TypeError(
                "EpisodeStatistics counts one environment's episodes: "
                "use Vectorized(EpisodeStatistics(env))"
            )
        super().__init__(env)

    def reset(self, key, params=None):
        obs, state = self.env.reset(key, params)
        zero_f, zero_i = jnp.float32(0.0), jnp.int32(0)
        return obs, EpisodeStatisticsState(state, zero_f, zero_i, zero_f, zero_i)

    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self.env.step(
            key, state.env_state, action, params
        )
        done = terminated | truncated
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        new_state = EpisodeStatisticsState(
            env_state,
            jnp.where(done, 0.0, episode_return),
            jnp.where(done, 0, episode_length),
            jnp.where(done, episode_return, state.last_return),
            jnp.where(done, episode_length, state.last_length),
        )
        info = {
            **info,
            "episode_done": done,
            "episode_return": new_state.last_return,
            "episode_length": new_state.last_length,
        }
        return obs, new_state, reward, terminated, truncated, info


class Vectorized(OuterWrapper):
    """`jax.vmap` of `reset` / `step` over a leading axis of keys (and params).

    `reset(keys[N], params)`, `step(keys[N], states, actions[N], params)`.
    With `batched_params=True`, `params` carries the same leading axis
    (one configuration per environment: domain randomisation, curricula);
    otherwise one `params` is shared. Spaces describe a single environment.
    """

    def __init__(self, env: Env, batched_params: bool = False):
        super().__init__(env)
        self.batched_params = batched_params

    def _params_axis(self, params):
        return 0 if self.batched_params and params is not None else None

    def reset(self, keys, params=None):
        return jax.vmap(self.env.reset, in_axes=(0, self._params_axis(params)))(keys, params)

    def step(self, keys, state, action, params=None):
        return jax.vmap(self.env.step, in_axes=(0, 0, 0, self._params_axis(params)))(
            keys, state, action, params
        )
