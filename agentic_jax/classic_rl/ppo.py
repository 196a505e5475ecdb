"""Proximal Policy Optimization with GAE, compiled end to end (PureJaxRL style).

Each update: run `num_envs` environments `num_steps` steps with the current
policy (`envs.run_steps`: vmap + scan), compute GAE advantages and λ-returns
(`rl.gae`, bootstrapping from V(final_obs) on truncation), then take
`update_epochs` passes of `num_minibatches` Adam steps on

    L = mean(clipped surrogate) + vf_coef·mean(clipped value loss) + ent_coef·mean(−entropy)

(`rl.clipped_surrogate_loss`, `rl.ppo_value_loss`, `rl.entropy_loss`), with
advantages normalised per minibatch. The whole training run is one
`jax.jit`-able function of a PRNG key, so `jax.vmap(train)(keys)` trains many
seeds at once. Schulman et al. (2017), "Proximal Policy Optimization
Algorithms", arXiv:1707.06347; GAE: Schulman et al. (2015), arXiv:1506.02438;
PureJaxRL: Lu et al. (2022), arXiv:2210.05639.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl.common import (
    action_log_prob,
    adam,
    advantages_and_returns,
    categorical_policy,
    episode_metrics,
    init_actor_critic,
    make_train,
)
from agentic_jax.classic_rl.networks import actor_critic_apply
from agentic_jax.envs import Env, EpisodeStatistics, run_steps


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    num_envs: int = 16
    num_steps: int = 128
    num_updates: int = 30
    update_epochs: int = 4
    num_minibatches: int = 8
    learning_rate: float = 5e-3
    anneal_lr: bool = True
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 0.5
    hidden: tuple[int, ...] = (64, 64)


def ppo_loss(params, batch, config: PPOConfig):
    """The PPO objective on a flat minibatch; returns (loss, metrics)."""
    logits, value = actor_critic_apply(params, batch["obs"])
    logp = action_log_prob(logits, batch["action"])
    adv = batch["advantage"]
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    policy = rl.clipped_surrogate_loss(jnp.exp(logp - batch["logp"]), adv, config.clip_eps).mean()
    value_loss = rl.ppo_value_loss(value, batch["value"], batch["return"], config.clip_eps).mean()
    entropy = -rl.entropy_loss(logits).mean()
    loss = policy + config.vf_coef * value_loss - config.ent_coef * entropy
    return loss, {"policy_loss": policy, "value_loss": value_loss, "entropy": entropy}


def make_ppo(env: Env, config: PPOConfig = PPOConfig(), env_params=None):
    """Returns `train(key) -> (params, metrics)`; metrics are per update, shape [num_updates]."""
    env = EpisodeStatistics(env)
    env_params = env.default_params if env_params is None else env_params
    batch_size = config.num_envs * config.num_steps
    if batch_size % config.num_minibatches:
        raise ValueError(
            f"num_envs × num_steps ({batch_size}) must split into num_minibatches "
            f"({config.num_minibatches}) equal minibatches"
        )
    minibatch_size = batch_size // config.num_minibatches
    steps_per_update = config.update_epochs * config.num_minibatches
    schedule = (
        optax.linear_schedule(config.learning_rate, 0.0, config.num_updates * steps_per_update)
        if config.anneal_lr
        else config.learning_rate
    )
    optimizer = adam(schedule, config.max_grad_norm)

    def sgd_epoch(carry, key):
        params, opt_state, batch = carry
        perm = jax.random.permutation(key, batch_size)
        minibatches = jax.tree.map(
            lambda x: x[perm].reshape(config.num_minibatches, minibatch_size, *x.shape[1:]), batch
        )

        def sgd_step(carry, minibatch):
            params, opt_state = carry
            grads, metrics = jax.grad(ppo_loss, has_aux=True)(params, minibatch, config)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        (params, opt_state), metrics = jax.lax.scan(sgd_step, (params, opt_state), minibatches)
        return (params, opt_state, batch), metrics

    def update(carry, key):
        (params, opt_state), obs, env_state = carry
        key_run, key_sgd = jax.random.split(key)
        obs, env_state, traj = run_steps(
            env,
            categorical_policy,
            key_run,
            env_params,
            obs,
            env_state,
            config.num_steps,
            policy_params=params,
        )
        advantages, returns = advantages_and_returns(
            params, traj, obs, config.gamma, config.gae_lambda
        )
        batch = {
            "obs": traj.obs,
            "action": traj.action,
            "advantage": advantages,
            "return": returns,
            **traj.extras,
        }
        batch = jax.tree.map(lambda x: x.reshape(batch_size, *x.shape[2:]), batch)
        (params, opt_state, _), metrics = jax.lax.scan(
            sgd_epoch, (params, opt_state, batch), jax.random.split(key_sgd, config.update_epochs)
        )
        metrics = {**jax.tree.map(jnp.mean, metrics), **episode_metrics(traj)}
        return ((params, opt_state), obs, env_state), metrics

    init = init_actor_critic(env, env_params, config.hidden, optimizer)
    return make_train(env, env_params, config.num_envs, init, update, config.num_updates)
