"""Batched rollouts: `jax.vmap` over environments inside one `lax.scan` over time.

The whole loop is one XLA program (the PureJaxRL recipe, Lu et al., 2022,
arXiv:2210.05639): no host round-trip per step, so thousands of small
environments step in parallel on one device.

Policies. `policy_fn(key, obs) -> action` sees *one* environment's
observation (it is vmapped over environments, with one key each). Pass
`policy_params=p` to call `policy_fn(p, key, obs)` instead, with `p` shared
by every environment (network weights, an ε, a Q-table). A policy may
return `ActionOutput(action, extras)` to record per-step extras (log-prob,
value) in `Transition.extras`.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from agentic_jax.envs.core import Env, PyTree
from agentic_jax.envs.wrappers import Vectorized


class ActionOutput(NamedTuple):
    """What a policy may return instead of a bare action."""

    action: PyTree
    extras: PyTree = None


@struct.dataclass
class Transition:
    """One step of a batch of environments; from `rollout`, arrays are `[T, N, ...]`.

    `next_obs` is what the agent sees next (a *reset* observation where the
    episode ended); `final_obs` is the true successor of `obs`, to bootstrap
    from. They differ only where `terminated | truncated`.
    """

    obs: PyTree
    action: PyTree
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: PyTree
    final_obs: PyTree
    info: dict[str, Any]
    extras: PyTree = None

    @property
    def done(self) -> jax.Array:
        return self.terminated | self.truncated


def bootstrap_inputs(
    reward, terminated, truncated, final_value, gamma
) -> tuple[jax.Array, jax.Array]:
    """Rewards and discounts for `rl.gae` / `rl.lambda_returns` over auto-reset streams.

    discount_t = γ·(1 − done_t) cuts every trace at an episode end, and the
    truncation bootstrap γ·V(final_obs_t) is folded into the reward:
    r'_t = r_t + γ·truncated_t·V(final_obs_t). Then the usual recursions
    with `values[t + 1] = V(next_obs_t)` give the right targets in all three
    cases (continuing, terminated, truncated), as in Pardo et al. (2018),
    arXiv:1712.00378. Works elementwise on any shape.
    """
    terminated, truncated = jnp.asarray(terminated, bool), jnp.asarray(truncated, bool)
    cut = truncated & ~terminated
    reward = jnp.asarray(reward, jnp.float32) + gamma * jnp.where(cut, final_value, 0.0)
    discount = jnp.where(terminated | truncated, 0.0, gamma).astype(jnp.float32)
    return reward, discount


def _policy(policy_fn: Callable, policy_params):
    if policy_params is None:
        return jax.vmap(policy_fn)
    return jax.vmap(lambda key, obs: policy_fn(policy_params, key, obs))


def run_steps(
    env: Env,
    policy_fn: Callable,
    key: jax.Array,
    env_params: PyTree,
    obs: PyTree,
    state: PyTree,
    num_steps: int,
    *,
    policy_params: PyTree = None,
    batched_params: bool = False,
) -> tuple[PyTree, PyTree, Transition]:
    """Continues a batch of environments for `num_steps`; returns `(obs, state, transitions)`.

    `obs` / `state` are batched (leading axis N, e.g. from `Vectorized(env).reset`),
    so training loops can carry them from one rollout to the next.
    """
    venv = Vectorized(env, batched_params)
    policy = _policy(policy_fn, policy_params)
    num_envs = jax.tree.leaves(obs)[0].shape[0]

    def body(carry, step_key):
        obs, state = carry
        key_policy, key_env = jax.random.split(step_key)
        out = policy(jax.random.split(key_policy, num_envs), obs)
        action, extras = out if isinstance(out, ActionOutput) else (out, None)
        next_obs, state, reward, terminated, truncated, info = venv.step(
            jax.random.split(key_env, num_envs), state, action, env_params
        )
        info = dict(info)
        final_obs = info.pop("final_observation")
        transition = Transition(
            obs, action, reward, terminated, truncated, next_obs, final_obs, info, extras
        )
        return (next_obs, state), transition

    (obs, state), transitions = jax.lax.scan(body, (obs, state), jax.random.split(key, num_steps))
    return obs, state, transitions


def rollout(
    env: Env,
    policy_fn: Callable,
    key: jax.Array,
    env_params: PyTree,
    num_envs: int,
    num_steps: int,
    *,
    policy_params: PyTree = None,
    batched_params: bool = False,
) -> Transition:
    """Resets `num_envs` environments and steps them `num_steps` times: `Transition[T, N]`.

    Traceable end to end; jit it with the env, policy and sizes static, e.g.
    `jax.jit(rollout, static_argnums=(0, 1, 4, 5))`. `env_params=None` uses the
    defaults; with `batched_params=True` it has a leading axis of size N.
    """
    key_reset, key_run = jax.random.split(key)
    obs, state = Vectorized(env, batched_params).reset(
        jax.random.split(key_reset, num_envs), env_params
    )
    return run_steps(
        env,
        policy_fn,
        key_run,
        env_params,
        obs,
        state,
        num_steps,
        policy_params=policy_params,
        batched_params=batched_params,
    )[2]
