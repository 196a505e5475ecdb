"""COMA: the decentralised actors reach the optimum joint action of a common-payoff matrix game,
and the centralised critic's TD(λ) targets equal a slow numpy reference on the signalling game
(its inputs built independently: state, the other acting agents' one-hot actions, the agent id)."""

import itertools

import jax
import numpy as np
import pytest

from agentic_jax.classic_rl.coma import COMAConfig, critic_targets, init_coma, make_coma
from agentic_jax.classic_rl.marl import joint_policy, policy_logits
from agentic_jax.envs import MatrixGame, SignallingGame, Vectorized, run_steps

# A common-payoff coordination game: the optimum (0, 0) pays 10, miscoordinating on it costs 5,
# and (2, 2) is a safe equilibrium worth 4.
COORDINATION = np.array([[[10.0, -5.0, 0.0], [-5.0, 6.0, 0.0], [0.0, 0.0, 4.0]]] * 2)


def test_coma_reaches_the_optimum_joint_action_of_a_cooperative_game():
    game = MatrixGame(COORDINATION)
    config = COMAConfig(num_envs=64, num_steps=2, num_iterations=100)
    params, metrics = jax.jit(jax.vmap(make_coma(game, config)))(
        jax.random.split(jax.random.key(0), 2)
    )
    obs, _ = game.reset(jax.random.key(0))
    policies = np.asarray(jax.nn.softmax(jax.vmap(policy_logits, (0, None))(params, obs)))
    assert (policies[:, :, 0] > 0.95).all()  # every seed, both agents: the optimum
    np.testing.assert_allclose(np.asarray(metrics["episode_return"])[:, -1], 10.0, atol=1.0)
    assert (np.asarray(metrics["critic_loss"])[:, -1] < 0.5).all()


def numpy_q(critic, state, actions, mask, agent, num_actions):
    """Q_agent(s, (u_{-agent}, ·)) ``[A]`` of the critic MLP, its input built row by row."""
    n = len(actions)
    others = np.zeros((n, num_actions))
    for j in range(n):
        if j != agent and mask[j]:
            others[j, actions[j]] = 1.0
    x = np.concatenate([state, others.reshape(-1), np.eye(n)[agent]])
    for layer in critic[:-1]:
        x = np.tanh(x @ np.asarray(layer["w"]) + np.asarray(layer["b"]))
    return x @ np.asarray(critic[-1]["w"]) + np.asarray(critic[-1]["b"])


def test_critic_targets_match_a_numpy_td_lambda_reference():
    game = SignallingGame(num_targets=3)
    config = COMAConfig(gamma=0.9, td_lambda=0.7, hidden=(8,))
    params = init_coma(jax.random.key(0), game, config)
    obs, state = Vectorized(game).reset(jax.random.split(jax.random.key(1), 4))
    # three steps: speak, guess (terminal), speak again (cut by the rollout: bootstrapped)
    last_obs, _, traj = run_steps(
        game, joint_policy, jax.random.key(2), None, obs, state, 3, policy_params=params
    )
    got = np.asarray(critic_targets(params, traj, last_obs, jax.random.key(3), config))
    assert got.shape == (3, 4, 2)
    o = jax.tree.map(np.asarray, traj.obs)
    actions, reward = np.asarray(traj.action), np.asarray(traj.reward)
    done = np.asarray(traj.terminated)
    assert not done[0].any() and done[1].all() and not done[2].any()
    critic = params["critic"]
    for e, i in itertools.product(range(4), range(2)):

        def q_taken(t, e=e, i=i):
            return numpy_q(critic, o.state[t, e], actions[t, e], o.mask[t, e], i, 3)[
                actions[t, e, i]
            ]

        g1 = reward[1, e, i]  # terminal: no bootstrap
        g0 = reward[0, e, i] + 0.9 * ((1 - 0.7) * q_taken(1) + 0.7 * g1)
        np.testing.assert_allclose(got[:2, e, i], [g0, g1], rtol=1e-5, atol=1e-5)
        # the cut stream bootstraps from Q_i of a joint action sampled at the last observation
        last = jax.tree.map(lambda x, e=e: np.asarray(x)[e], last_obs)
        candidates = [
            reward[2, e, i] + 0.9 * numpy_q(critic, last.state, np.array(u), last.mask, i, 3)[u[i]]
            for u in itertools.product(range(3), repeat=2)
        ]
        assert np.isclose(got[2, e, i], candidates, rtol=1e-5, atol=1e-5).any()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="critic_steps"):
        COMAConfig(critic_steps=0)
