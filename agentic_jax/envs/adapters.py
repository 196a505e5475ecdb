"""Adapters: gymnax and pgx environments behind the `Env` API.

Both libraries are optional and imported only when an adapter is built:
`pip install -e ".[games]"` (gymnax and pgx; tested with gymnax 1.0.1, whose
import also needs `six`, and pgx 2.6.0). Our own `Env.step` does the
auto-reset, so the adapters call the libraries' non-resetting transitions.
"""

import importlib

import jax
import jax.numpy as jnp

from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env


def _require(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"this adapter needs `{module}`: pip install -e '.[games]' (or {module.split('.')[0]})"
        ) from e


def _convert_space(space) -> spaces.Space:
    """A gymnax Discrete / Box space as ours (others are not supported)."""
    kind = type(space).__name__
    if kind == "Discrete":
        return spaces.Discrete(space.n)
    if kind == "Box":
        return spaces.Box(space.low, space.high, space.shape, space.dtype)
    raise NotImplementedError(f"gymnax space {kind} has no counterpart here")


class GymnaxEnv(Env):
    """A gymnax (>= 1.0) environment: `GymnaxEnv("CartPole-v1")`, or an instance and its params.

    gymnax 1.0 `step_env` reports termination and `is_truncated(state, params)`
    the time limit (`params.max_steps_in_episode`); a step that does both
    reads as terminated only, as with `TimeLimit`.
    """

    def __init__(self, env_or_id, params=None, **make_kwargs):
        if isinstance(env_or_id, str):
            env_or_id, made_params = _require("gymnax").make(env_or_id, **make_kwargs)
            params = made_params if params is None else params
        if not hasattr(env_or_id, "is_truncated"):
            raise TypeError(
                f"{type(env_or_id).__name__} has no is_truncated: GymnaxEnv needs "
                "gymnax >= 1.0, whose environments tell truncation from termination "
                "(gymnax 1.0.1 supports jax < 0.12)"
            )
        self.env = env_or_id
        self._params = self.env.default_params if params is None else params

    @property
    def default_params(self):
        return self._params

    @property
    def name(self) -> str:
        return f"Gymnax[{self.env.name}]"

    def reset_env(self, key, params):
        return self.env.reset_env(key, params)

    def step_env(self, key, state, action, params):
        obs, state, reward, terminated, info = self.env.step_env(key, state, action, params)
        terminated = jnp.asarray(terminated, bool)
        truncated = jnp.asarray(self.env.is_truncated(state, params), bool) & ~terminated
        return obs, state, reward, terminated, truncated, dict(info)

    def observation_space(self, params=None):
        return _convert_space(
            self.env.observation_space(self.default_params if params is None else params)
        )

    def action_space(self, params=None):
        return _convert_space(
            self.env.action_space(self.default_params if params is None else params)
        )


class PgxEnv(Env):
    """A pgx game (`PgxEnv("tic_tac_toe")`) seen by the player to move (self-play).

    The observation is `state.observation` (from the mover's perspective),
    the reward is the *acting* player's, and `info` carries the
    "legal_action_mask" for the next move, the "current_player" and all
    players' "rewards" (in a two-player game the loser's −1 arrives on the
    winner's move, so credit it from there). pgx has no params: `params`
    is ignored.
    """

    def __init__(self, env_or_id, **make_kwargs):
        self.env = (
            _require("pgx").make(env_or_id, **make_kwargs)
            if isinstance(env_or_id, str)
            else env_or_id
        )

    @property
    def name(self) -> str:
        return f"Pgx[{self.env.id}]"

    def reset_env(self, key, params):
        state = self.env.init(key)
        return state.observation, state

    def step_env(self, key, state, action, params):
        player = state.current_player
        state = self.env.step(state, action, key)
        info = {
            "legal_action_mask": state.legal_action_mask,
            "current_player": state.current_player,
            "rewards": state.rewards,
        }
        return (
            state.observation,
            state,
            state.rewards[player],
            state.terminated,
            state.truncated,
            info,
        )

    def observation_space(self, params=None):
        obs = jax.eval_shape(self.env.init, jax.random.key(0)).observation
        if (
            obs.dtype == jnp.bool_
        ):  # board planes (most pgx games): samples must be boards of 0s and 1s
            return spaces.Box(0, 1, obs.shape, obs.dtype)
        return spaces.Box(-jnp.inf, jnp.inf, obs.shape, obs.dtype)

    def action_space(self, params=None):
        return spaces.Discrete(self.env.num_actions)
