"""Tabular Q-learning and TD(λ) prediction, compiled end to end.

Both run `num_envs` environments in parallel (`envs.run_steps`) and update a
table with the gradient of an `agentic_jax.rl` loss. A table entry seen k
times in one batch moves by lr × (the mean of its k errors), so the step
size does not grow with the number of environments; the step size decays
linearly to `lr_end`, as stochastic-approximation convergence needs
(Robbins & Monro, 1951).

* Q-learning (Watkins, 1989; Watkins & Dayan, 1992): off-policy control with
  an ε-greedy behaviour policy, one-step targets r + γ·max_a Q(s', a)
  (`rl.q_learning_loss`), bootstrapping from the true successor
  `final_obs` (never on termination). Converges to Q*.
* TD(λ) (Sutton, 1988): evaluation of a fixed policy π[s, a] with offline
  λ-returns over rollout segments (`rl.td_lambda`, the forward view, equal to
  accumulating eligibility traces applied at the end of the segment);
  truncation bootstraps via `envs.bootstrap_inputs`. Converges to V^π.
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from agentic_jax import rl
from agentic_jax.classic_rl.common import episode_metrics, epsilon_greedy, make_train, space_sizes
from agentic_jax.envs import Env, EpisodeStatistics, bootstrap_inputs, run_steps


def averaged_table_step(table: jax.Array, loss_fn, index, lr) -> tuple[jax.Array, jax.Array]:
    """(table − lr·∇loss / visits, the loss at ``table``): each entry moves by the mean of its
    errors in the batch; the loss reported is the one this step descended, before the update."""
    visits = jnp.zeros(table.shape, jnp.float32).at[index].add(1.0)
    loss, grad = jax.value_and_grad(loss_fn)(table)
    return table - lr * grad / jnp.maximum(visits, 1.0), loss


@dataclasses.dataclass(frozen=True)
class QLearningConfig:
    num_envs: int = 16
    num_iterations: int = 3000
    learning_rate: float = 0.5
    lr_end: float = 0.005
    gamma: float = 0.9
    epsilon: float = 0.3
    log_every: int = 100


def make_q_learning(env: Env, config: QLearningConfig = QLearningConfig(), env_params=None):
    """Returns `train(key) -> (q_table [S, A], metrics)` for a Discrete-observation env."""
    env = EpisodeStatistics(env)
    env_params = env.default_params if env_params is None else env_params
    num_states, num_actions = space_sizes(env, env_params, tabular=True)
    lr = optax.linear_schedule(config.learning_rate, config.lr_end, config.num_iterations)

    def policy(q, key, obs):
        return epsilon_greedy(q[obs], key, config.epsilon)

    def iteration(carry, key):
        (q, step), obs, env_state = carry
        obs, env_state, traj = run_steps(
            env, policy, key, env_params, obs, env_state, 1, policy_params=q
        )
        t = jax.tree.map(lambda x: x[0], traj)
        discount = jnp.where(t.terminated, 0.0, config.gamma)

        def loss(q):
            return jnp.sum(
                jax.vmap(rl.q_learning_loss)(q[t.obs], t.action, t.reward, discount, q[t.final_obs])
            )

        q, loss_value = averaged_table_step(q, loss, (t.obs, t.action), lr(step))
        return ((q, step + 1), obs, env_state), {"loss": loss_value, **episode_metrics(traj)}

    def init(key):
        return jnp.zeros((num_states, num_actions), jnp.float32), jnp.int32(0)

    return make_train(
        env, env_params, config.num_envs, init, iteration, config.num_iterations, config.log_every
    )


@dataclasses.dataclass(frozen=True)
class TDLambdaConfig:
    num_envs: int = 16
    num_steps: int = 32
    num_updates: int = 300
    learning_rate: float = 0.3
    lr_end: float = 0.01
    gamma: float = 0.9
    lambda_: float = 0.8


def make_td_lambda(
    env: Env, policy: jax.Array, config: TDLambdaConfig = TDLambdaConfig(), env_params=None
):
    """Returns `train(key) -> (v_table [S], metrics)` evaluating the policy table π[S, A]."""
    env = EpisodeStatistics(env)
    env_params = env.default_params if env_params is None else env_params
    num_states, num_actions = space_sizes(env, env_params, tabular=True)
    log_policy = jnp.log(jnp.asarray(policy, jnp.float32))
    if log_policy.shape != (
        num_states,
        num_actions,
    ):  # indexing would clamp a wrong-shaped table silently
        raise ValueError(
            f"policy must have shape (num_states, num_actions) = {(num_states, num_actions)}, "
            f"got {log_policy.shape}"
        )
    lr = optax.linear_schedule(config.learning_rate, config.lr_end, config.num_updates)
    td_lambda = jax.vmap(rl.td_lambda, in_axes=(1, 1, 1, 1, None), out_axes=1)

    def behave(key, obs):
        return jax.random.categorical(key, log_policy[obs])

    def update(carry, key):
        (v, step), obs, env_state = carry
        obs, env_state, traj = run_steps(
            env, behave, key, env_params, obs, env_state, config.num_steps
        )
        reward, discount = bootstrap_inputs(
            traj.reward, traj.terminated, traj.truncated, v[traj.final_obs], config.gamma
        )

        def loss(v):
            errors = td_lambda(v[traj.obs], reward, discount, v[traj.next_obs], config.lambda_)
            return 0.5 * jnp.sum(jnp.square(errors))

        v, loss_value = averaged_table_step(v, loss, traj.obs, lr(step))
        return ((v, step + 1), obs, env_state), {"loss": loss_value, **episode_metrics(traj)}

    def init(key):
        return jnp.zeros((num_states,), jnp.float32), jnp.int32(0)

    return make_train(env, env_params, config.num_envs, init, update, config.num_updates)
