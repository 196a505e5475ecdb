"""Pieces shared by the agents: the training-loop skeleton, policies, GAE over
auto-reset rollouts, episode metrics and the optimiser."""

import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl.networks import actor_critic_apply, actor_critic_init
from agentic_jax.envs import (
    ActionOutput,
    EpisodeStatistics,
    Transition,
    Vectorized,
    bootstrap_inputs,
    rollout,
    spaces,
)


def categorical_policy(params, key, obs) -> ActionOutput:
    """Samples a ~ π(·|obs) and records its log-probability and the value V(obs)."""
    logits, value = actor_critic_apply(params, obs)
    action = jax.random.categorical(key, logits)
    logp = jax.nn.log_softmax(logits)[action]
    return ActionOutput(action, {"logp": logp, "value": value})


def greedy_policy(params, key, obs) -> jax.Array:
    """argmax_a π(a|obs): the deterministic policy used for evaluation."""
    return jnp.argmax(actor_critic_apply(params, obs)[0], axis=-1)


def evaluate(
    env, policy_fn, policy_params, key, num_envs: int, num_steps: int, env_params=None
) -> jax.Array:
    """Mean return of the episodes that end within `num_steps` steps of `num_envs` environments."""
    traj = rollout(
        EpisodeStatistics(env),
        policy_fn,
        key,
        env_params,
        num_envs,
        num_steps,
        policy_params=policy_params,
    )
    return episode_metrics(traj)["episode_return"]


def action_log_prob(logits, action) -> jax.Array:
    """log π(a|s) for integer actions [...] from logits [..., A]."""
    return jnp.take_along_axis(jax.nn.log_softmax(logits), action[..., None], axis=-1)[..., 0]


def advantages_and_returns(params, traj: Transition, last_obs, gamma: float, lambda_: float):
    """GAE(γ, λ) advantages and λ-returns for a time-major `[T, N]` rollout.

    Termination zeroes the bootstrap; truncation bootstraps from
    V(final_obs) (`envs.bootstrap_inputs`). λ = 1 gives Monte-Carlo returns
    (bootstrapped only where the rollout or a time limit cuts an episode).
    """
    final_value = actor_critic_apply(params, traj.final_obs)[1]
    r_t, discount_t = bootstrap_inputs(
        traj.reward, traj.terminated, traj.truncated, final_value, gamma
    )
    values = jnp.concatenate(
        [traj.extras["value"], actor_critic_apply(params, last_obs)[1][None]], axis=0
    )
    # GAE along time (axis 0), for each of the N streams.
    advantages = jax.vmap(rl.gae, in_axes=(1, 1, 1, None), out_axes=1)(
        r_t, values, discount_t, lambda_
    )
    return advantages, advantages + traj.extras["value"]


def episode_metrics(traj: Transition) -> dict[str, jax.Array]:
    """Mean return of the episodes that ended in this rollout (NaN if none) and their count."""
    done = traj.info["episode_done"]
    count = jnp.sum(done)
    total = jnp.sum(jnp.where(done, traj.info["episode_return"], 0.0))
    return {
        "episode_return": jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan),
        "episodes": count,
    }


def adam(learning_rate, max_grad_norm: float) -> optax.GradientTransformation:
    """Adam with global-norm gradient clipping."""
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=1e-5)
    )


def space_sizes(env, env_params, tabular: bool = False) -> tuple[int, int]:
    """(observation size, number of actions), or a ValueError naming a space the agent cannot use.

    Every agent picks among Discrete actions; tabular agents index their table
    with a Discrete observation (a state index), the others feed a 1-D Box
    observation to an MLP. Checked up front: otherwise the failure surfaces
    deep in tracing (a missing `.n`, an empty shape, a matmul mismatch).
    """
    obs_space, action_space = env.observation_space(env_params), env.action_space(env_params)
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(f"the agent needs a Discrete action space, got {action_space}")
    if tabular:
        if not isinstance(obs_space, spaces.Discrete):
            raise ValueError(
                f"a tabular agent needs a Discrete observation space (a state index), got {obs_space}"
            )
        return obs_space.n, action_space.n
    if not isinstance(obs_space, spaces.Box) or len(obs_space.shape) != 1:
        raise ValueError(
            f"the agent's MLP needs a 1-D Box observation space, got {obs_space} "
            "(flatten observations with envs.TransformObservation)"
        )
    return obs_space.shape[0], action_space.n


def init_actor_critic(env, env_params, hidden: tuple[int, ...], optimizer):
    """`init(key) -> (params, opt_state)` for an actor-critic on a vector-observation, Discrete-action env."""
    obs_dim, num_actions = space_sizes(env, env_params)

    def init(key):
        params = actor_critic_init(key, obs_dim, num_actions, hidden)
        return params, optimizer.init(params)

    return init


def epsilon_greedy(q_values: jax.Array, key: jax.Array, epsilon) -> jax.Array:
    """argmax_a q(a), or a uniformly random action with probability ε."""
    key_explore, key_action = jax.random.split(key)
    random_action = jax.random.randint(key_action, (), 0, q_values.shape[-1])
    return jnp.where(
        jax.random.uniform(key_explore) < epsilon, random_action, jnp.argmax(q_values, axis=-1)
    )


def chunked_scan(iteration, carry, key, num_iterations: int, log_every: int):
    """Scans `iteration(carry, key) -> (carry, metrics)` `num_iterations` times.

    Metrics come back per chunk of `log_every` iterations, shape
    [num_iterations // log_every]: "episode_return" averaged over the episodes
    that ended in the chunk (weighted by "episodes", NaN if none), the rest
    averaged over iterations.
    """
    if num_iterations % log_every:
        raise ValueError(
            f"num_iterations ({num_iterations}) must be a multiple of log_every ({log_every})"
        )

    def chunk(carry, key):
        carry, metrics = jax.lax.scan(iteration, carry, jax.random.split(key, log_every))
        count = jnp.sum(metrics["episodes"])
        total = jnp.nansum(metrics["episode_return"] * metrics["episodes"])
        means = {
            name: jnp.mean(value)
            for name, value in metrics.items()
            if name not in ("episodes", "episode_return")
        }
        episode_return = jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)
        return carry, {**means, "episode_return": episode_return, "episodes": count}

    return jax.lax.scan(chunk, carry, jax.random.split(key, num_iterations // log_every))


def make_train(
    env, env_params, num_envs: int, init_agent, iteration, num_iterations: int, log_every: int = 1
):
    """The skeleton of every agent: `train(key) -> (agent[0], metrics)`.

    Resets `num_envs` environments, builds the agent tuple with
    `init_agent(key)`, and runs `iteration((agent, obs, env_state), key) ->
    ((agent, obs, env_state), metrics)` `num_iterations` times (`chunked_scan`);
    the first element of the agent (the learned params or table) is returned.
    """

    def train(key):
        key_init, key_reset, key_train = jax.random.split(key, 3)
        obs, env_state = Vectorized(env).reset(jax.random.split(key_reset, num_envs), env_params)
        carry = (init_agent(key_init), obs, env_state)
        (agent, _, _), metrics = chunked_scan(
            iteration, carry, key_train, num_iterations, log_every
        )
        return agent[0], metrics

    return train
