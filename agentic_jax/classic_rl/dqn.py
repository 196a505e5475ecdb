"""Deep Q-Networks with a replay buffer (uniform or prioritised) and a target network.

Every iteration steps `num_envs` environments once with an ε-greedy policy
(ε decays linearly), writes the transitions (bootstrapping from the true
successor `final_obs`, discount γ·(1 − terminated)) to a jnp ring buffer,
and, once `learning_starts` transitions are stored, takes one Adam step on a
replayed batch of `rl.q_learning_loss` (or `rl.double_q_learning_loss`)
against a target network copied every `target_period` iterations. With
prioritised replay the loss is importance-weighted and the replayed
priorities are reset to |δ|. The training run is one jittable function of a
key (vmappable over seeds).
Mnih et al. (2015), "Human-level control through deep reinforcement
learning"; van Hasselt et al. (2016), "Deep RL with Double Q-learning",
arXiv:1509.06461; Schaul et al. (2016), "Prioritized Experience Replay",
arXiv:1511.05952.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl import replay
from agentic_jax.classic_rl.common import (
    adam,
    episode_metrics,
    epsilon_greedy,
    make_train,
    space_sizes,
)
from agentic_jax.classic_rl.networks import mlp_apply, mlp_init
from agentic_jax.envs import Env, EpisodeStatistics, run_steps


@dataclasses.dataclass(frozen=True)
class DQNConfig:
    num_envs: int = 8
    num_iterations: int = 4000
    buffer_size: int = 10_000
    batch_size: int = 64
    learning_starts: int = 1000
    target_period: int = 100
    learning_rate: float = 1e-3
    max_grad_norm: float = 10.0
    gamma: float = 0.99
    epsilon_start: float = 1.0
    epsilon_end: float = 0.05
    epsilon_fraction: float = 0.5
    double: bool = True
    prioritized: bool = False
    alpha: float = 0.6
    beta_start: float = 0.4
    hidden: tuple[int, ...] = (64, 64)
    log_every: int = 100


def dqn_losses(params, target_params, batch, config: DQNConfig) -> jax.Array:
    """Per-transition ½·δ² for a batch (double or plain Q-learning targets)."""
    q_tm1 = mlp_apply(params, batch["obs"])
    q_t_target = mlp_apply(target_params, batch["next_obs"])
    args = (q_tm1, batch["action"], batch["reward"], batch["discount"])
    if config.double:
        q_t_selector = mlp_apply(params, batch["next_obs"])
        return jax.vmap(rl.double_q_learning_loss)(*args, q_t_target, q_t_selector)
    return jax.vmap(rl.q_learning_loss)(*args, q_t_target)


def make_dqn(env: Env, config: DQNConfig = DQNConfig(), env_params=None):
    """Returns `train(key) -> (q_params, metrics)`; metrics per `log_every` iterations."""
    if (
        config.learning_starts > config.buffer_size
    ):  # the buffer's size never reaches it: no update would run
        raise ValueError(
            f"learning_starts ({config.learning_starts}) must not exceed buffer_size ({config.buffer_size})"
        )
    env = EpisodeStatistics(env)
    env_params = env.default_params if env_params is None else env_params
    obs_dim, num_actions = space_sizes(env, env_params)
    optimizer = adam(config.learning_rate, config.max_grad_norm)
    # optax makes a schedule with 0 transition steps constant at its *initial* value: ε would
    # stay at epsilon_start.
    decay_steps = int(config.epsilon_fraction * config.num_iterations)
    epsilon = (
        optax.linear_schedule(config.epsilon_start, config.epsilon_end, decay_steps)
        if decay_steps > 0
        else optax.constant_schedule(config.epsilon_end)
    )
    beta = optax.linear_schedule(config.beta_start, 1.0, config.num_iterations)

    def policy(policy_params, key, obs):
        params, eps = policy_params
        return epsilon_greedy(mlp_apply(params, obs), key, eps)

    def sample(buffer, key, step):
        if config.prioritized:
            return replay.sample_prioritized(
                buffer, key, config.batch_size, config.alpha, beta(step)
            )
        batch, slots = replay.sample_uniform(buffer, key, config.batch_size)
        return batch, slots, jnp.ones((config.batch_size,), jnp.float32)

    def learn(params, target_params, opt_state, buffer, key, step):
        batch, slots, weights = sample(buffer, key, step)

        def loss_fn(params):
            losses = dqn_losses(params, target_params, batch, config)
            return jnp.mean(weights * losses), losses

        (loss, losses), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        if config.prioritized:
            buffer = replay.update_priorities(buffer, slots, jnp.sqrt(2.0 * losses))
        return optax.apply_updates(params, updates), opt_state, buffer, loss

    def iteration(carry, key):
        (params, target_params, opt_state, buffer, step), obs, env_state = carry
        key_act, key_learn = jax.random.split(key)
        obs, env_state, traj = run_steps(
            env,
            policy,
            key_act,
            env_params,
            obs,
            env_state,
            1,
            policy_params=(params, epsilon(step)),
        )
        t = jax.tree.map(lambda x: x[0], traj)
        buffer = replay.buffer_add(
            buffer,
            {
                "obs": t.obs,
                "action": t.action,
                "reward": t.reward,
                "discount": jnp.where(t.terminated, 0.0, config.gamma),
                "next_obs": t.final_obs,
            },
        )
        params, opt_state, buffer, loss = jax.lax.cond(
            buffer.size >= config.learning_starts,
            lambda: learn(params, target_params, opt_state, buffer, key_learn, step),
            lambda: (params, opt_state, buffer, jnp.float32(0.0)),
        )
        target_params = jax.tree.map(
            lambda online, target: jnp.where(step % config.target_period == 0, online, target),
            params,
            target_params,
        )
        carry = ((params, target_params, opt_state, buffer, step + 1), obs, env_state)
        return carry, {"loss": loss, "epsilon": epsilon(step), **episode_metrics(traj)}

    example = {
        "obs": jnp.zeros((obs_dim,), jnp.float32),
        "action": jnp.int32(0),
        "reward": jnp.float32(0.0),
        "discount": jnp.float32(0.0),
        "next_obs": jnp.zeros((obs_dim,), jnp.float32),
    }

    def init(key):
        params = mlp_init(key, (obs_dim, *config.hidden, num_actions))
        buffer = replay.buffer_init(example, config.buffer_size)
        return params, params, optimizer.init(params), buffer, jnp.int32(0)

    return make_train(
        env, env_params, config.num_envs, init, iteration, config.num_iterations, config.log_every
    )
