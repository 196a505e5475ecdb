"""Classic agents: convergence to exact solutions, solving the bandit and cart-pole, replay buffers.

Fixed seeds, small budgets; each threshold is stated next to its assert.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax import classic_rl, envs
from agentic_jax.envs.classic import BernoulliBandit, CartPole, chain_mdp, value_iteration

GAMMA = 0.9
CHAIN = chain_mdp(8, slip=0.1)
CHAIN_ENV = envs.TimeLimit(CHAIN, 50)  # truncation must not bias the values: they bootstrap
V_STAR, Q_STAR = value_iteration(CHAIN.default_params, GAMMA)
ALIVE = np.asarray(~CHAIN.default_params.terminal)
BANDIT = BernoulliBandit(probs=(0.2, 0.5, 0.8, 0.35))


def test_q_learning_converges_to_value_iteration():
    config = classic_rl.QLearningConfig(num_envs=16, num_iterations=3000, gamma=GAMMA)
    q, metrics = jax.jit(jax.vmap(classic_rl.make_q_learning(CHAIN_ENV, config)))(
        jax.random.split(jax.random.key(0), 2)
    )
    error = np.abs(np.asarray(q - Q_STAR))[:, ALIVE].max(axis=(1, 2))
    assert np.all(error < 0.03), (
        error
    )  # 48k transitions per seed: |Q − Q*|∞ < 0.03 (V* ∈ [0.46, 0.98])
    assert bool(jnp.all(jnp.argmax(q[:, ALIVE], -1) == jnp.argmax(Q_STAR[ALIVE], -1)))
    assert metrics["episode_return"].shape == (2, 30)


def test_table_step_reports_the_loss_it_descended():
    """The logged loss is the one at the table before the update (after it, the errors have
    already shrunk); entries seen twice move by their mean error."""
    from agentic_jax.classic_rl.tabular import averaged_table_step

    targets, index = jnp.asarray([1.0, 3.0, -2.0]), jnp.asarray([0, 0, 2])

    def loss(table):
        return 0.5 * jnp.sum(jnp.square(targets - table[index]))

    table = jnp.zeros(4)
    new, value = averaged_table_step(table, loss, index, 0.5)
    assert float(value) == pytest.approx(float(loss(table))) == pytest.approx(7.0)
    np.testing.assert_allclose(new, [1.0, 0.0, -1.0, 0.0])  # 0.5 × mean(1, 3); 0.5 × (−2)


def test_td_lambda_converges_to_value_iteration():
    optimal_policy = jax.nn.one_hot(jnp.argmax(Q_STAR, axis=1), 2)
    config = classic_rl.TDLambdaConfig(
        num_envs=16, num_steps=32, num_updates=300, gamma=GAMMA, lambda_=0.8
    )
    v, _ = jax.jit(jax.vmap(classic_rl.make_td_lambda(CHAIN_ENV, optimal_policy, config)))(
        jax.random.split(jax.random.key(1), 2)
    )
    error = np.abs(np.asarray(v - V_STAR))[:, ALIVE].max(axis=1)
    assert np.all(error < 0.01), error  # V^π* = V*, within 0.01 after 153k transitions


def test_ppo_solves_the_bandit_and_is_vmappable_over_seeds():
    config = classic_rl.PPOConfig(
        num_envs=16,
        num_steps=8,
        num_updates=20,
        update_epochs=2,
        num_minibatches=2,
        learning_rate=1e-2,
        hidden=(16,),
    )
    train = classic_rl.make_ppo(BANDIT, config)
    keys = jax.random.split(jax.random.key(2), 4)
    params, metrics = jax.jit(jax.vmap(train))(keys)
    probs = jax.nn.softmax(
        jax.vmap(classic_rl.actor_critic_apply, in_axes=(0, None))(params, jnp.zeros((1,)))[0]
    )
    assert bool(jnp.all(probs[:, 2] > 0.9)), probs  # the best arm (p = 0.8) after 2,560 pulls
    assert float(metrics["episode_return"][:, -5:].mean()) > 0.7  # optimum 0.8, uniform 0.46
    assert (
        len({round(float(r), 4) for r in metrics["episode_return"][:, 0]}) > 1
    )  # the seeds differ


def test_ppo_solves_cartpole():
    config = classic_rl.PPOConfig(num_envs=16, num_steps=128, num_updates=30)  # 61,440 env steps
    params, metrics = jax.jit(jax.vmap(classic_rl.make_ppo(CartPole(), config)))(
        jax.random.split(jax.random.key(0), 2)
    )

    @jax.jit
    def returns(params, key):
        keys = jax.random.split(key, 2)

        def mean_returns(policy):
            return jax.vmap(lambda p, k: classic_rl.evaluate(CartPole(), policy, p, k, 16, 1000))(
                params, keys
            )

        policies = (classic_rl.greedy_policy, classic_rl.categorical_policy)
        return [mean_returns(policy) for policy in policies]

    greedy, sampled = returns(params, jax.random.key(1))
    print("PPO CartPole greedy / sampled returns:", greedy, sampled)
    # Of 500 (CartPole-v1 counts ≥ 475 as solved); sampling too, past CartPole-v0's solved bar
    # of 195; and it started near random (~22).
    assert np.all(np.asarray(greedy) >= 400.0), greedy
    assert np.all(np.asarray(sampled) >= 250.0), sampled
    assert np.all(np.asarray(metrics["episode_return"][:, 0]) < 40.0)


def test_reinforce_solves_the_bandit():
    config = classic_rl.ReinforceConfig(
        num_envs=16, num_steps=8, num_updates=50, learning_rate=3e-2, hidden=(16,)
    )
    params, metrics = jax.jit(jax.vmap(classic_rl.make_reinforce(BANDIT, config)))(
        jax.random.split(jax.random.key(3), 2)
    )
    probs = jax.nn.softmax(
        jax.vmap(classic_rl.actor_critic_apply, in_axes=(0, None))(params, jnp.zeros((1,)))[0]
    )
    assert bool(jnp.all(probs[:, 2] > 0.9)), probs  # the best arm after 6,400 pulls (docs/envs.md)
    assert float(metrics["episode_return"][:, -10:].mean()) > 0.7


def test_dqn_with_prioritized_replay_learns_cartpole():
    config = classic_rl.DQNConfig(
        num_envs=8, num_iterations=2500, learning_starts=500, prioritized=True, log_every=100
    )
    _, metrics = jax.jit(classic_rl.make_dqn(CartPole(), config))(jax.random.key(4))
    late = np.nanmean(np.asarray(metrics["episode_return"][-5:]))
    assert late > 100.0, metrics["episode_return"]  # 20k env steps: from ~22 (random) to > 100
    np.testing.assert_allclose(metrics["epsilon"][-1], 0.05, rtol=1e-5)


def test_replay_ring_buffer_overwrites_the_oldest():
    buffer = classic_rl.buffer_init({"x": jnp.int32(0)}, capacity=5)
    for start in (0, 3, 6):
        buffer = classic_rl.buffer_add(buffer, {"x": jnp.arange(start, start + 3)})
    assert int(buffer.size) == 5 and int(buffer.position) == 4
    np.testing.assert_array_equal(buffer.data["x"], [5, 6, 7, 8, 4])
    batch, slots = classic_rl.sample_uniform(buffer, jax.random.key(0), 256)
    np.testing.assert_array_equal(batch["x"], buffer.data["x"][slots])
    assert set(np.asarray(batch["x"]).tolist()) == {4, 5, 6, 7, 8}


def test_prioritized_sampling_is_proportional_and_skips_empty_slots():
    buffer = classic_rl.buffer_init({"x": jnp.int32(0)}, capacity=8)
    buffer = classic_rl.buffer_add(buffer, {"x": jnp.arange(4)})  # slots 4..7 stay empty
    buffer = classic_rl.update_priorities(
        buffer, jnp.arange(4), jnp.array([1.0, 2.0, 3.0, 4.0]), eps=0.0
    )
    _, slots, weights = jax.jit(classic_rl.sample_prioritized, static_argnums=2)(
        buffer, jax.random.key(0), 4000, 1.0, 1.0
    )
    freq = np.bincount(np.asarray(slots), minlength=8) / 4000
    np.testing.assert_allclose(freq, [0.1, 0.2, 0.3, 0.4, 0, 0, 0, 0], atol=0.01)
    # w ∝ 1/P, normalised by the largest weight (the rarest slot).
    np.testing.assert_allclose(weights, 1.0 / (np.asarray(slots) + 1.0), rtol=1e-5)
    new = classic_rl.buffer_add(buffer, {"x": jnp.array([9])})
    assert float(new.priorities[4]) == 4.0  # new items enter with the maximum priority


def test_actor_critic_targets_bootstrap_on_truncation_only():
    params = classic_rl.actor_critic_init(jax.random.key(0), 1, 2, (4,))
    params["critic"][-1] = {
        "w": jnp.zeros_like(params["critic"][-1]["w"]),
        "b": jnp.full((1,), 2.0),
    }  # V ≡ 2
    flags = (
        jnp.array([[False], [True], [False]]),
        jnp.array([[False], [False], [True]]),
    )  # [T = 3, N = 1]
    traj = envs.Transition(
        obs=jnp.zeros((3, 1, 1)),
        action=jnp.zeros((3, 1), jnp.int32),
        reward=jnp.ones((3, 1)),
        terminated=flags[0],
        truncated=flags[1],
        next_obs=jnp.zeros((3, 1, 1)),
        final_obs=jnp.zeros((3, 1, 1)),
        info={},
        extras={"value": jnp.full((3, 1), 2.0)},
    )
    _, returns = classic_rl.common.advantages_and_returns(params, traj, jnp.zeros((1, 1)), 0.5, 0.9)
    # continuing: r + γ·((1 − λ)·V + λ·G_1); terminated: r; truncated: r + γ·V(final), not r.
    np.testing.assert_allclose(
        returns[:, 0], [1.0 + 0.5 * (0.1 * 2.0 + 0.9 * 1.0), 1.0, 1.0 + 0.5 * 2.0], rtol=1e-6
    )


def test_dqn_epsilon_reaches_its_end_value_when_the_decay_is_shorter_than_one_iteration():
    # 0.1 × 4 iterations rounds to 0 decay steps; optax would then hold ε at epsilon_start (a random policy).
    config = classic_rl.DQNConfig(
        num_envs=1,
        num_iterations=4,
        buffer_size=8,
        batch_size=2,
        learning_starts=8,
        epsilon_fraction=0.1,
        hidden=(4,),
        log_every=1,
    )
    _, metrics = jax.jit(classic_rl.make_dqn(CartPole(), config))(jax.random.key(0))
    np.testing.assert_allclose(metrics["epsilon"], config.epsilon_end)


def test_agents_name_bad_spaces_and_configs():
    with pytest.raises(ValueError, match=r"1-D Box observation space, got Discrete\(8\)"):
        classic_rl.make_ppo(CHAIN_ENV)
    with pytest.raises(ValueError, match=r"Discrete observation space \(a state index\), got Box"):
        classic_rl.make_q_learning(CartPole())
    policy = jnp.full((8, 2), 0.5)
    with pytest.raises(ValueError, match=r"policy must have shape .* \(8, 2\), got \(2, 8\)"):
        classic_rl.make_td_lambda(
            CHAIN_ENV, policy.T
        )  # indexing would have clamped states 2..7 to row 1
    with pytest.raises(ValueError, match=r"num_steps \(15\) must split into num_minibatches \(2\)"):
        classic_rl.make_ppo(
            BANDIT, classic_rl.PPOConfig(num_envs=3, num_steps=5, num_minibatches=2)
        )
    with pytest.raises(
        ValueError, match=r"learning_starts \(200\) must not exceed buffer_size \(100\)"
    ):
        classic_rl.make_dqn(
            CartPole(), classic_rl.DQNConfig(buffer_size=100, learning_starts=200)
        )  # it would never learn
    with pytest.raises(ValueError, match="a batch of 6 items to a buffer of capacity 5"):
        classic_rl.buffer_add(classic_rl.buffer_init({"x": jnp.int32(0)}, 5), {"x": jnp.arange(6)})
