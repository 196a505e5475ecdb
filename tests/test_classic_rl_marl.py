"""Multi-agent PPO: independent and centralised critics reach the prisoner's dilemma's Nash
equilibrium, the centralised critic learns the closed-form value of the profile, the signalling
game's code is learned, and the per-agent advantages equal a slow numpy GAE."""

import jax
import numpy as np
import pytest

from agentic_jax.classic_rl.marl import (
    MARLConfig,
    agent_advantages,
    init_marl,
    joint_policy,
    make_marl,
    policy_logits,
    values,
)
from agentic_jax.envs import MatrixGame, SignallingGame, Vectorized, run_steps


@pytest.mark.parametrize("critic", ["independent", "centralised"])
def test_learners_reach_the_prisoners_dilemma_equilibrium(critic):
    game = MatrixGame("prisoners_dilemma")
    config = MARLConfig(critic=critic, num_envs=16, num_steps=2, num_iterations=60)
    params, metrics = jax.jit(make_marl(game, config))(jax.random.key(0))
    obs, _ = game.reset(jax.random.key(0))
    policies = np.asarray(jax.nn.softmax(policy_logits(params, obs)))
    assert game.nash_conv(policies) < 0.05  # both defect
    np.testing.assert_allclose(metrics["episode_return"][-1], game.payoffs[:, 1, 1], atol=0.2)
    # the critic has learned each player's expected payoff under the learned profile
    np.testing.assert_allclose(values(params, obs, critic), game.values(policies), atol=0.1)


def test_the_signalling_game_is_solved_with_a_learned_code():
    game = SignallingGame(num_targets=3)
    config = MARLConfig(critic="centralised", num_envs=32, num_steps=4, num_iterations=80)
    params, metrics = jax.jit(make_marl(game, config))(jax.random.key(0))
    returns = np.asarray(metrics["episode_return"])
    assert returns[:5].mean() < 0.6 and returns[-10:].mean() > 0.9  # guessing earns 1/3
    # the speaker's greedy messages are a code: distinct targets get distinct messages
    speaker = jax.vmap(lambda x: policy_logits(params, x))
    obs, _ = jax.vmap(game.reset)(jax.random.split(jax.random.key(1), 64))
    messages = np.argmax(np.asarray(speaker(obs))[:, 0], -1)
    targets = np.argmax(np.asarray(obs.state[:, :3]), -1)
    assert len({(t, m) for t, m in zip(targets, messages)}) == 3 == len(set(messages))


@pytest.mark.parametrize("critic", ["independent", "centralised"])
def test_agent_advantages_are_each_agents_gae(critic):
    game = SignallingGame(num_targets=3)
    config = MARLConfig(critic=critic, gamma=0.9, gae_lambda=0.8)
    params = init_marl(jax.random.key(0), game, config)
    obs, state = Vectorized(game).reset(jax.random.split(jax.random.key(1), 4))
    last_obs, _, traj = run_steps(
        game, joint_policy, jax.random.key(2), None, obs, state, 5, policy_params=params
    )
    got = np.asarray(agent_advantages(params, traj, last_obs, config)[0])
    v = np.asarray(values(params, traj.obs, critic))
    v_last = np.asarray(values(params, last_obs, critic))
    reward, done = np.asarray(traj.reward), np.asarray(traj.terminated)
    want = np.zeros_like(reward)
    for e in range(4):
        for i in range(2):
            running = 0.0
            for t in reversed(range(5)):
                following = v_last[e, i] if t == 4 else v[t + 1, e, i]
                discount = 0.0 if done[t, e] else 0.9
                delta = reward[t, e, i] + discount * following - v[t, e, i]
                running = delta + discount * 0.8 * running
                want[t, e, i] = running
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_unknown_critics_are_refused():
    with pytest.raises(ValueError, match="critic must be one of"):
        MARLConfig(critic="omniscient")
