"""Multi-agent PPO on Markov games: independent learners, or decentralised actors with a
centralised critic (CTDE), compiled end to end.

Every agent has its own actor π_i(a | o_i) on its own observation row (``GameObservation.local``),
so execution is decentralised.  What differs is the critic that turns rewards into advantages:

* ``critic="independent"``: each agent's own V_i(o_i), trained on its own reward: independent
  PPO (IPPO; de Witt et al., 2020, arXiv:2011.09533).  From each agent's view the others are part
  of a non-stationary environment.
* ``critic="centralised"``: one network V(s) → ``[N]`` on the global state, used only in
  training (MAPPO; Yu et al., 2022, arXiv:2103.01955; Lowe et al., 2017, arXiv:1706.02275).

Advantages are GAE(γ, λ) per agent (``rl.gae`` over each agent's reward stream, with the
truncation bootstrap of ``envs.bootstrap_inputs``), and each actor takes ``num_epochs`` full-batch
steps on the clipped surrogate (``rl.clipped_surrogate_loss``) over the steps where it acted
(``GameObservation.mask``): an idle agent's action is neither executed nor learned from, but the
rewards it receives while idle reach its last action through the recursion.  One Adam step per
epoch updates actors and critic together.
"""

from __future__ import annotations

import dataclasses

import gin
import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl.common import adam
from agentic_jax.classic_rl.networks import mlp_apply, mlp_init
from agentic_jax.envs import ActionOutput, Vectorized, bootstrap_inputs, run_steps, spaces
from agentic_jax.envs.markov_game import GameObservation, MarkovGame

CRITICS = ("independent", "centralised")


@gin.configurable
@dataclasses.dataclass(frozen=True)
class MARLConfig:
    critic: str = "centralised"
    num_envs: int = 32
    num_steps: int = 8
    num_iterations: int = 200
    num_epochs: int = 4
    learning_rate: float = 3e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_epsilon: float = 0.2
    value_coef: float = 0.5
    ent_coef: float = 0.01
    max_grad_norm: float = 1.0
    hidden: tuple[int, ...] = (32,)

    def __post_init__(self):
        if self.critic not in CRITICS:
            raise ValueError(f"critic must be one of {CRITICS}, got {self.critic!r}")


def game_sizes(game: MarkovGame) -> tuple[int, int, int]:
    """(local observation size, state size, number of actions), or a ValueError naming the space."""
    obs, state, action = game.observation_space(), game.state_space(), game.action_space()
    if not isinstance(action, spaces.Discrete):
        raise ValueError(f"the agents need a Discrete action space, got {action}")
    for name, space in (("observation", obs), ("state", state)):
        if not isinstance(space, spaces.Box) or len(space.shape) != 1:
            raise ValueError(f"the {name} space must be a 1-D Box, got {space}")
    return obs.shape[0], state.shape[0], action.n


def init_marl(key, game: MarkovGame, config: MARLConfig) -> dict:
    """``{"actors", "critic"}``: actors stacked on a leading agent axis; the critic is stacked
    per agent (independent) or one network with an output per agent (centralised)."""
    obs_dim, state_dim, num_actions = game_sizes(game)
    n = game.num_agents
    key_actors, key_critic = jax.random.split(key)

    def actor(k):
        return mlp_init(k, (obs_dim, *config.hidden, num_actions), head_gain=0.01)

    if config.critic == "independent":
        critic = jax.vmap(lambda k: mlp_init(k, (obs_dim, *config.hidden, 1)))(
            jax.random.split(key_critic, n)
        )
    else:
        critic = mlp_init(key_critic, (state_dim, *config.hidden, n))
    return {"actors": jax.vmap(actor)(jax.random.split(key_actors, n)), "critic": critic}


def policy_logits(params: dict, obs: GameObservation) -> jax.Array:
    """``[..., N, A]``: each agent's actor on its own observation row."""
    return jax.vmap(mlp_apply, in_axes=(0, -2), out_axes=-2)(params["actors"], obs.local)


def values(params: dict, obs: GameObservation, critic: str) -> jax.Array:
    """``[..., N]``: V_i(o_i) per agent, or the centralised V(s)."""
    if critic == "independent":
        v = jax.vmap(mlp_apply, in_axes=(0, -2), out_axes=-2)(params["critic"], obs.local)
        return v[..., 0]
    return mlp_apply(params["critic"], obs.state)


def joint_policy(params: dict, key, obs: GameObservation) -> ActionOutput:
    """Samples every agent's action from its own actor; records the log-probabilities."""
    logits = policy_logits(params, obs)
    action = jax.random.categorical(key, logits)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], axis=-1)[:, 0]
    return ActionOutput(action, {"logp": logp})


def agent_advantages(params, traj, last_obs, config: MARLConfig):
    """GAE advantages and λ-returns ``[T, E, N]`` of each agent's reward stream."""
    value = values(params, traj.obs, config.critic)
    final_value = values(params, traj.final_obs, config.critic)
    done = (traj.terminated[..., None], traj.truncated[..., None])
    r_t, discount_t = bootstrap_inputs(traj.reward, *done, final_value, config.gamma)
    discount_t = jnp.broadcast_to(discount_t, r_t.shape)
    stacked = jnp.concatenate([value, values(params, last_obs, config.critic)[None]], axis=0)
    gae = jax.vmap(jax.vmap(rl.gae, (1, 1, 1, None), 1), (1, 1, 1, None), 1)
    advantages = gae(r_t, stacked, discount_t, config.gae_lambda)
    return advantages, advantages + value


def marl_objective(params, batch, config: MARLConfig):
    """Clipped surrogate over acting steps + ½ value error + entropy bonus; (loss, metrics)."""
    obs, mask = batch["obs"], batch["obs"].mask
    log_probs = jax.nn.log_softmax(policy_logits(params, obs))
    logp = jnp.take_along_axis(log_probs, batch["action"][..., None], axis=-1)[..., 0]
    ratio = jnp.exp(logp - batch["logp"]).reshape(-1)
    surrogate = rl.clipped_surrogate_loss(
        ratio, batch["advantage"].reshape(-1), config.clip_epsilon
    )
    weight = mask.reshape(-1).astype(jnp.float32)
    policy_loss = jnp.sum(surrogate * weight) / jnp.maximum(weight.sum(), 1.0)
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    entropy = jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0)
    value_loss = 0.5 * jnp.mean(jnp.square(values(params, obs, config.critic) - batch["return"]))
    loss = policy_loss + config.value_coef * value_loss - config.ent_coef * entropy
    return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}


def make_game_train(
    game: MarkovGame, num_envs: int, num_steps: int, num_iterations: int, init, update
):
    """The skeleton of every game trainer: ``train(key) -> (params, metrics)``.

    ``init(key) -> (params, opt_state)``; each iteration plays ``num_steps`` steps of
    ``num_envs`` games with :func:`joint_policy` and ``params``, then ``update((params,
    opt_state), traj, last_obs, key) -> ((params, opt_state), metrics)``; the metrics gain
    ``episode_return`` ``[N]``: each agent's reward in the rollout per episode that ended in it
    (exact when ``num_steps`` is a multiple of a fixed-length game's episode), and ``episodes``.
    """

    def iteration(carry, key):
        agent, obs, state = carry
        key_rollout, key_update = jax.random.split(key)
        obs, state, traj = run_steps(
            game, joint_policy, key_rollout, None, obs, state, num_steps, policy_params=agent[0]
        )
        agent, metrics = update(agent, traj, obs, key_update)
        episodes = jnp.sum(traj.terminated | traj.truncated)
        metrics = metrics | {
            "episode_return": jnp.sum(traj.reward, axis=(0, 1)) / jnp.maximum(episodes, 1),
            "episodes": episodes,
        }
        return (agent, obs, state), metrics

    def train(key):
        key_init, key_reset, key_train = jax.random.split(key, 3)
        obs, state = Vectorized(game).reset(jax.random.split(key_reset, num_envs))
        carry = (init(key_init), obs, state)
        ((params, _), _, _), metrics = jax.lax.scan(
            iteration, carry, jax.random.split(key_train, num_iterations)
        )
        return params, metrics

    return train


def make_marl(game: MarkovGame, config: MARLConfig = MARLConfig()):
    """``train(key) -> (params, metrics)``, metrics per iteration: the losses, the actors'
    entropy, and each agent's ``episode_return`` ``[num_iterations, N]`` (`make_game_train`)."""
    game_sizes(game)
    optimizer = adam(config.learning_rate, config.max_grad_norm)
    grad_fn = jax.grad(marl_objective, has_aux=True)

    def init(key):
        params = init_marl(key, game, config)
        return params, optimizer.init(params)

    def update(agent, traj, last_obs, key):
        del key  # PPO's update is deterministic
        advantages, returns = agent_advantages(agent[0], traj, last_obs, config)
        batch = {
            "obs": traj.obs,
            "action": traj.action,
            "logp": traj.extras["logp"],
            "advantage": advantages,
            "return": returns,
        }

        def epoch(agent, _):
            params, opt_state = agent
            grads, metrics = grad_fn(params, batch, config)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), metrics

        agent, metrics = jax.lax.scan(epoch, agent, None, config.num_epochs)
        return agent, jax.tree.map(lambda x: x[-1], metrics)

    return make_game_train(
        game, config.num_envs, config.num_steps, config.num_iterations, init, update
    )
