"""Classic environments: exact solutions, sampling statistics, cart-pole physics."""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax import envs
from agentic_jax.envs.classic import (
    BernoulliBandit,
    CartPole,
    chain_mdp,
    grid_mdp,
    optimal_return,
    policy_evaluation,
    value_iteration,
)

GAMMA = 0.9


def test_value_iteration_on_a_deterministic_chain_matches_closed_form():
    mdp = chain_mdp(8, slip=0.0)
    v, q = value_iteration(mdp.default_params, GAMMA)
    # From cell s the goal is n − 1 − s moves away and pays 1 on arrival: V* = γ^(n−2−s).
    np.testing.assert_allclose(v[:-1], GAMMA ** (6 - np.arange(7)), rtol=1e-5)
    assert bool(jnp.all(jnp.argmax(q[:-1], axis=1) == 1)) and float(v[-1]) == 0.0


def test_value_iteration_satisfies_bellman_optimality_and_dominates_policies():
    for mdp in (chain_mdp(8, slip=0.2), grid_mdp(4, 5, slip=0.2)):
        params = mdp.default_params
        v, q = value_iteration(params, GAMMA, tol=1e-7)
        alive = ~params.terminal
        np.testing.assert_allclose(jnp.where(alive, q.max(axis=1), 0.0), v, atol=1e-5)
        greedy = jax.nn.one_hot(jnp.argmax(q, axis=1), mdp.num_actions)
        np.testing.assert_allclose(policy_evaluation(params, greedy, GAMMA), v, atol=1e-4)
        uniform = jnp.full((mdp.num_states, mdp.num_actions), 1.0 / mdp.num_actions)
        assert bool(jnp.all(policy_evaluation(params, uniform, GAMMA) <= v + 1e-5))
        assert float(jnp.max(v - policy_evaluation(params, uniform, GAMMA))) > 0.05


def test_grid_optimal_policy_avoids_the_pit():
    mdp = grid_mdp(3, 3, slip=0.0, pits=((0, 1),))
    _, q = value_iteration(mdp.default_params, GAMMA)
    assert int(jnp.argmax(q[0])) == 1  # from the top-left, go DOWN, not EAST into the pit
    np.testing.assert_allclose(q[0, 3], -1.0, atol=1e-6)


def test_tabular_transitions_follow_the_table():
    mdp = chain_mdp(5, slip=0.25)
    params = mdp.default_params
    _, state = mdp.reset(jax.random.key(0))
    state = state.replace(state=jnp.int32(2))
    keys = jax.random.split(jax.random.key(1), 8192)
    next_obs = jax.vmap(lambda k: mdp.step_env(k, state, 1, params)[0])(keys)
    freq = jnp.bincount(next_obs, length=5) / keys.shape[0]
    np.testing.assert_allclose(freq, params.transitions[2, 1], atol=0.02)
    starts = jax.vmap(lambda k: mdp.reset(k)[0])(keys)
    assert int(jnp.max(starts)) < 4 and int(jnp.min(starts)) == 0  # never starts in the goal


def test_bandit_rewards_match_arm_probabilities():
    env = BernoulliBandit(probs=(0.1, 0.6, 0.3))
    keys = jax.random.split(jax.random.key(0), 4096)
    _, state = env.reset(keys[0])
    for arm, prob in enumerate((0.1, 0.6, 0.3)):
        rewards, terminated = jax.vmap(lambda k, a=arm: env.step(k, state, a)[2:4])(keys)
        assert abs(float(rewards.mean()) - prob) < 0.03 and bool(terminated.all())
    assert float(optimal_return(env.default_params)) == np.float32(0.6)


def test_cartpole_physics():
    env, params = CartPole(), CartPole().default_params
    _, state = env.reset(jax.random.key(0))
    state = state.replace(physics=jnp.zeros(4))
    obs, _, reward, terminated, truncated, _ = env.step_env(jax.random.key(0), state, 1, params)
    # Pushing right accelerates the cart right and tips the pole left (θ̈ < 0), after one Euler step.
    assert float(obs[1]) > 0 and float(obs[3]) < 0 and float(obs[0]) == 0.0 and float(reward) == 1.0
    assert not bool(terminated | truncated)
    # Pushing left mirrors it exactly.
    mirrored = env.step_env(jax.random.key(0), state, 0, params)[0]
    np.testing.assert_allclose(mirrored, -obs, atol=1e-7)


def _cartpole_reference_step(physics, action):
    """One Euler step of Barto, Sutton & Anderson (1983), eqs. (frictionless), in float64 with
    Gym's CartPole-v1 constants; ``length`` is the pole's half-length, as in the paper."""
    gravity, mass_cart, mass_pole, length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    x, x_dot, theta, theta_dot = physics
    force = force_mag if action == 1 else -force_mag
    total = mass_cart + mass_pole
    theta_acc = (
        gravity * np.sin(theta)
        + np.cos(theta) * ((-force - mass_pole * length * theta_dot**2 * np.sin(theta)) / total)
    ) / (length * (4 / 3 - mass_pole * np.cos(theta) ** 2 / total))
    x_acc = (
        force + mass_pole * length * (theta_dot**2 * np.sin(theta) - theta_acc * np.cos(theta))
    ) / total
    physics = np.array(
        [x + tau * x_dot, x_dot + tau * x_acc, theta + tau * theta_dot, theta_dot + tau * theta_acc]
    )
    terminated = abs(physics[0]) > 2.4 or abs(physics[2]) > 12 * 2 * np.pi / 360
    return physics, terminated


def test_cartpole_follows_the_classic_equations_under_random_actions():
    env = CartPole()
    step = jax.jit(env.step_env)
    rng = np.random.default_rng(0)
    for episode in range(6):
        obs, state = env.reset(jax.random.key(episode))
        physics, steps = np.asarray(obs, np.float64), 0
        while True:
            action = int(rng.integers(2))
            obs, state, reward, terminated, _, _ = step(
                jax.random.key(0), state, action, env.default_params
            )
            physics, done = _cartpole_reference_step(physics, action)
            np.testing.assert_allclose(obs, physics, rtol=1e-4, atol=1e-5)
            assert bool(terminated) == done and float(reward) == 1.0
            steps += 1
            if done:
                break
        assert steps > 5


def test_cartpole_random_policy_episode_length_and_time_limit():
    env = envs.EpisodeStatistics(CartPole())
    tr = jax.jit(envs.rollout, static_argnums=(0, 1, 4, 5))(
        env,
        lambda key, obs: jax.random.bernoulli(key).astype(jnp.int32),
        jax.random.key(0),
        None,
        64,
        200,
    )
    lengths = tr.info["episode_length"][tr.info["episode_done"]]
    assert 15.0 < float(lengths.mean()) < 30.0  # a random policy balances ~22 steps
    short = CartPole().default_params.replace(max_steps=5)
    _obs, state = CartPole().reset(jax.random.key(0), short)
    for _ in range(5):
        _obs, state, _, terminated, truncated, _ = CartPole().step(
            jax.random.key(1), state, 0, short
        )
    assert bool(truncated) and not bool(terminated) and int(state.time) == 0
