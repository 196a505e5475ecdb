"""REINFORCE with a learned baseline, compiled end to end.

Each update collects `num_steps` × `num_envs` steps with the current policy,
forms Monte-Carlo returns G_t (GAE with λ = 1 plus the baseline; an episode
cut by the rollout or a time limit is bootstrapped from the baseline), and
takes one Adam step on

    mean(−log π(a_t|s_t)·(G_t − b(s_t))) + baseline_coef·mean(½(b(s_t) − G_t)²) + ent_coef·mean(−H)

(`rl.reinforce_loss`, `rl.entropy_loss`). Williams (1992), "Simple statistical
gradient-following algorithms for connectionist reinforcement learning";
Sutton & Barto (2018), §13.4.
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
class ReinforceConfig:
    num_envs: int = 16
    num_steps: int = 64
    num_updates: int = 100
    learning_rate: float = 3e-3
    gamma: float = 0.99
    baseline_coef: float = 0.5
    ent_coef: float = 0.0
    max_grad_norm: float = 1.0
    hidden: tuple[int, ...] = (64,)


def reinforce_objective(params, batch, config: ReinforceConfig):
    """The REINFORCE-with-baseline loss on flat arrays; returns (loss, metrics)."""
    logits, baseline = actor_critic_apply(params, batch["obs"])
    logp = action_log_prob(logits, batch["action"])
    policy = rl.reinforce_loss(logp, batch["return"], baseline).mean()
    baseline_loss = 0.5 * jnp.mean(jnp.square(baseline - batch["return"]))
    entropy = -rl.entropy_loss(logits).mean()
    loss = policy + config.baseline_coef * baseline_loss - config.ent_coef * entropy
    return loss, {"policy_loss": policy, "value_loss": baseline_loss, "entropy": entropy}


def make_reinforce(env: Env, config: ReinforceConfig = ReinforceConfig(), env_params=None):
    """Returns `train(key) -> (params, metrics)`; metrics are per update, shape [num_updates]."""
    env = EpisodeStatistics(env)
    env_params = env.default_params if env_params is None else env_params
    optimizer = adam(config.learning_rate, config.max_grad_norm)

    def update(carry, key):
        (params, opt_state), obs, env_state = carry
        obs, env_state, traj = run_steps(
            env,
            categorical_policy,
            key,
            env_params,
            obs,
            env_state,
            config.num_steps,
            policy_params=params,
        )
        _, returns = advantages_and_returns(params, traj, obs, config.gamma, 1.0)
        batch = {"obs": traj.obs, "action": traj.action, "return": returns}
        batch = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), batch)
        grads, metrics = jax.grad(reinforce_objective, has_aux=True)(params, batch, config)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return ((params, opt_state), obs, env_state), {**metrics, **episode_metrics(traj)}

    init = init_actor_critic(env, env_params, config.hidden, optimizer)
    return make_train(env, env_params, config.num_envs, init, update, config.num_updates)
