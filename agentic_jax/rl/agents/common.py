"""Pieces shared by the actor-critic agents: the sampling policy, GAE over
auto-reset rollouts, episode metrics and the Adam optimiser."""

import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.envs import PolicyOutput, Transition, Vectorized, bootstrap_inputs
from agentic_jax.rl.agents.networks import actor_critic_apply, actor_critic_init


def categorical_policy(params, key, obs) -> PolicyOutput:
    """Samples a ~ π(·|obs) and records its log-probability and the value V(obs)."""
    logits, value = actor_critic_apply(params, obs)
    action = jax.random.categorical(key, logits)
    logp = jax.nn.log_softmax(logits)[action]
    return PolicyOutput(action, {"logp": logp, "value": value})


def action_log_prob(logits, action) -> jax.Array:
    """log π(a|s) for integer actions [...] from logits [..., A]."""
    return jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], axis=-1)[..., 0]


def advantages_and_returns(params, traj: Transition, last_obs, gamma: float, lam: float):
    """GAE(γ, λ) advantages and λ-returns for a time-major `[T, N]` rollout.

    Termination zeroes the bootstrap; truncation bootstraps from
    V(final_obs) (`envs.bootstrap_inputs`). λ = 1 gives Monte-Carlo returns
    (bootstrapped only where the rollout or a time limit cuts an episode).
    """
    final_value = actor_critic_apply(params, traj.final_obs)[1]
    reward, discount = bootstrap_inputs(traj.reward, traj.terminated, traj.truncated, final_value, gamma)
    values = jnp.concatenate([traj.extras["value"], actor_critic_apply(params, last_obs)[1][None]], axis=0)
    advantages = jax.vmap(rl.gae, in_axes=(1, 1, 1, None), out_axes=1)(reward, values, discount, lam)
    return advantages, advantages + traj.extras["value"]


def episode_metrics(traj: Transition) -> dict[str, jax.Array]:
    """Mean return of the episodes that ended in this rollout (NaN if none) and their count."""
    done = traj.info["episode_done"]
    count = jnp.sum(done)
    total = jnp.sum(jnp.where(done, traj.info["episode_return"], 0.0))
    return {"episode_return": jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan), "episodes": count}


def adam(learning_rate, max_grad_norm: float) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping."""
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=1e-5))


def actor_critic_train(env, env_params, config, optimizer, update):
    """`train(key) -> (params, metrics)`: init an actor-critic, reset `config.num_envs`
    environments, then `lax.scan` `update((params, opt_state, obs, env_state), key)`
    `config.num_updates` times."""
    obs_dim = env.observation_space(env_params).shape[0]
    num_actions = env.action_space(env_params).n

    def train(key):
        key_init, key_reset, key_train = jax.random.split(key, 3)
        params = actor_critic_init(key_init, obs_dim, num_actions, config.hidden)
        obs, env_state = Vectorized(env).reset(jax.random.split(key_reset, config.num_envs), env_params)
        carry = (params, optimizer.init(params), obs, env_state)
        (params, *_), metrics = jax.lax.scan(update, carry, jax.random.split(key_train, config.num_updates))
        return params, metrics

    return train
