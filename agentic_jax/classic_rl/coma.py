"""COMA: counterfactual multi-agent policy gradients on Markov games, compiled end to end.

Foerster et al. (2018), "Counterfactual Multi-Agent Policy Gradients", arXiv:1705.08926.
Execution is decentralised as in ``classic_rl.marl``: each agent's actor π_i(u_i | o_i) sees its
own observation row.  Training has one centralised critic over the *joint* action: for agent i
it reads the global state, everyone else's actions u_{-i} and i's identity, and outputs
Q_i(s, (u_{-i}, u'_i)) for each of i's A choices u'_i in one pass, so the counterfactual baseline
costs nothing extra.  Each agent's row predicts its own return, so general-sum games train too
(with a shared reward every row learns the same Q).

Each iteration plays ``num_steps`` steps of ``num_envs`` games, then

1. **critic**: ``critic_steps`` Adam steps on ½(Q_i(s_t, u_t) − G_t)², where G_t is the TD(λ)
   target ``rl.lambda_returns`` of each agent's reward stream over Q_i of the next taken joint
   action (`critic_targets`): the critic from before the iteration is the target network, so it
   is refreshed every iteration;
2. **actors**: one step of the policy gradient Σ_i log π_i(u_i | o_i) · A_i over the steps where
   agent i acts, with A_i the counterfactual advantage ``rl.counterfactual_advantages``
   Q_i(s, u) − Σ_{u'_i} π_i(u'_i | o_i) Q_i(s, (u_{-i}, u'_i)) from the updated critic, plus an
   entropy bonus.  One step per rollout: the update is on-policy, no ratio is clipped.

An idle agent's action (``GameObservation.mask`` false) is not executed, so the critic does not
see it, and it is not learned from.
"""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl.common import adam
from agentic_jax.classic_rl.marl import game_sizes, make_game_train, policy_logits
from agentic_jax.classic_rl.networks import mlp_apply, mlp_init
from agentic_jax.envs import bootstrap_inputs
from agentic_jax.envs.markov_game import GameObservation, MarkovGame


@gin.configurable
@dataclasses.dataclass(frozen=True)
class COMAConfig:
    num_envs: int = 32
    num_steps: int = 8
    num_iterations: int = 200
    critic_steps: int = 4
    actor_learning_rate: float = 3e-3
    critic_learning_rate: float = 1e-2
    gamma: float = 0.99
    td_lambda: float = 0.8
    ent_coef: float = 0.01
    max_grad_norm: float = 1.0
    hidden: tuple[int, ...] = (32,)

    def __post_init__(self):
        for name in ("num_envs", "num_steps", "num_iterations", "critic_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"COMAConfig.{name} must be at least 1, got {getattr(self, name)}")


def init_coma(key, game: MarkovGame, config: COMAConfig) -> dict:
    """``{"actors", "critic"}``: actors stacked on a leading agent axis, one critic whose input is
    :func:`critic_inputs`' row and whose output is one Q per action."""
    obs_dim, state_dim, num_actions = game_sizes(game)
    n = game.num_agents
    key_actors, key_critic = jax.random.split(key)

    def actor(k):
        return mlp_init(k, (obs_dim, *config.hidden, num_actions), head_gain=0.01)

    critic_dim = state_dim + n * num_actions + n
    return {
        "actors": jax.vmap(actor)(jax.random.split(key_actors, n)),
        "critic": mlp_init(key_critic, (critic_dim, *config.hidden, num_actions)),
    }


def critic_inputs(obs: GameObservation, actions, num_actions: int) -> jax.Array:
    """``[..., N, S + N·A + N]``: row i is the global state, the one-hot actions of the other
    acting agents (agent i's own block and idle agents' blocks zero) and the one-hot of i."""
    n = actions.shape[-1]
    acted = jax.nn.one_hot(actions, num_actions) * obs.mask[..., None]  # [..., N, A]
    others = acted[..., None, :, :] * (1.0 - jnp.eye(n))[:, :, None]  # [..., N (i), N (j), A]
    lead = actions.shape[:-1]
    state = jnp.broadcast_to(obs.state[..., None, :], (*lead, n, obs.state.shape[-1]))
    ids = jnp.broadcast_to(jnp.eye(n), (*lead, n, n))
    return jnp.concatenate([state, others.reshape(*lead, n, n * num_actions), ids], axis=-1)


def q_values(params: dict, obs: GameObservation, actions) -> jax.Array:
    """``[..., N, A]``: row i is Q_i(s, (u_{-i}, u'_i)) for each of agent i's actions u'_i."""
    num_actions = params["critic"][-1]["b"].shape[-1]
    return mlp_apply(params["critic"], critic_inputs(obs, actions, num_actions))


def taken(q, actions) -> jax.Array:
    """``[..., N]``: each agent's Q at the action it took."""
    return jnp.take_along_axis(q, actions[..., None], axis=-1)[..., 0]


def sampled_q(params: dict, key, obs: GameObservation) -> jax.Array:
    """``[..., N]``: Q_i of a joint action sampled from the actors at ``obs`` (the bootstrap of a
    stream cut by the rollout's end or by truncation, whose next action was never played)."""
    actions = jax.random.categorical(key, policy_logits(params, obs))
    return taken(q_values(params, obs, actions), actions)


def critic_targets(params: dict, traj, last_obs: GameObservation, key, config: COMAConfig):
    """TD(λ) targets ``[T, E, N]`` of each agent's Q at the taken joint action:
    G_t = r_t + γ_t((1 − λ) Q_i(s_{t+1}, u_{t+1}) + λ G_{t+1}), cut at episode ends, the
    truncation bootstrap folded into the reward (``envs.bootstrap_inputs``), and the last step
    bootstrapped from :func:`sampled_q` at ``last_obs``."""
    key_final, key_last = jax.random.split(key)
    q_taken = taken(q_values(params, traj.obs, traj.action), traj.action)
    final_q = sampled_q(params, key_final, traj.final_obs)
    done = (traj.terminated[..., None], traj.truncated[..., None])
    r_t, discount_t = bootstrap_inputs(traj.reward, *done, final_q, config.gamma)
    discount_t = jnp.broadcast_to(discount_t, r_t.shape)
    next_q = jnp.concatenate([q_taken[1:], sampled_q(params, key_last, last_obs)[None]], axis=0)
    returns = jax.vmap(jax.vmap(rl.lambda_returns, (1, 1, 1, None), 1), (1, 1, 1, None), 1)
    return jax.lax.stop_gradient(returns(r_t, discount_t, next_q, config.td_lambda))


def critic_loss(critic, params, batch):
    """½ mean (Q_i(s_t, u_t) − G_t)² over every step and agent; (loss, metrics)."""
    q = taken(
        q_values({**params, "critic": critic}, batch["obs"], batch["action"]), batch["action"]
    )
    loss = 0.5 * jnp.mean(jnp.square(q - batch["target"]))
    return loss, {"critic_loss": loss}


def actor_loss(actors, params, batch, ent_coef: float):
    """−mean over acting steps of log π_i(u_i) · A_i (COMA's counterfactual advantage from the
    critic in ``params``) − ``ent_coef`` · entropy; (loss, metrics)."""
    obs, action = batch["obs"], batch["action"]
    log_probs = jax.nn.log_softmax(policy_logits({**params, "actors": actors}, obs))
    q = q_values(params, obs, action)
    advantage = rl.counterfactual_advantages(q, jnp.exp(log_probs), action)
    weight = obs.mask.astype(jnp.float32)
    total = jnp.maximum(weight.sum(), 1.0)
    policy_loss = -jnp.sum(weight * taken(log_probs, action) * advantage) / total
    entropy = -jnp.sum(weight * jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)) / total
    loss = policy_loss - ent_coef * entropy
    return loss, {"policy_loss": policy_loss, "entropy": entropy}


def make_coma(game: MarkovGame, config: COMAConfig = COMAConfig()):
    """``train(key) -> (params, metrics)``, metrics per iteration: the critic's last loss, the
    actors' loss and entropy, and each agent's ``episode_return`` ``[num_iterations, N]``
    (``marl.make_game_train``)."""
    game_sizes(game)
    actor_optimizer = adam(config.actor_learning_rate, config.max_grad_norm)
    critic_optimizer = adam(config.critic_learning_rate, config.max_grad_norm)
    critic_grad = jax.grad(critic_loss, has_aux=True)
    actor_grad = jax.grad(actor_loss, has_aux=True)

    def init(key):
        params = init_coma(key, game, config)
        opt_state = actor_optimizer.init(params["actors"]), critic_optimizer.init(params["critic"])
        return params, opt_state

    def update(agent, traj, last_obs, key):
        params, (actor_state, critic_state) = agent
        batch = {
            "obs": traj.obs,
            "action": traj.action,
            "target": critic_targets(params, traj, last_obs, key, config),
        }

        def critic_step(carry, _):
            critic, state = carry
            grads, metrics = critic_grad(critic, params, batch)
            updates, state = critic_optimizer.update(grads, state, critic)
            return (optax.apply_updates(critic, updates), state), metrics

        (critic, critic_state), critic_metrics = jax.lax.scan(
            critic_step, (params["critic"], critic_state), None, config.critic_steps
        )
        params = {**params, "critic": critic}
        grads, metrics = actor_grad(params["actors"], params, batch, config.ent_coef)
        updates, actor_state = actor_optimizer.update(grads, actor_state, params["actors"])
        params = {**params, "actors": optax.apply_updates(params["actors"], updates)}
        metrics |= {"critic_loss": critic_metrics["critic_loss"][-1]}
        return (params, (actor_state, critic_state)), metrics

    return make_game_train(
        game, config.num_envs, config.num_steps, config.num_iterations, init, update
    )
