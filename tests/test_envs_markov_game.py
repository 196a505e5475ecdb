"""Markov games: joint actions through the single-agent rollout machinery, turn masks, rewards
per agent, and the closed-form Nash gap of matrix games."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.envs import ActionOutput, MatrixGame, SignallingGame, rollout
from agentic_jax.envs.markov_game import GAMES


def uniform_joint_policy(key, obs):
    return ActionOutput(jax.random.randint(key, (2,), 0, 3))


def test_signalling_rollouts_alternate_turns_and_reward_the_right_guess():
    game = SignallingGame(num_targets=3)
    traj = jax.jit(rollout, static_argnums=(0, 1, 4, 5))(
        game, uniform_joint_policy, jax.random.key(0), None, 64, 6
    )
    mask = np.asarray(traj.obs.mask)  # [T, E, 2]
    assert mask.shape == (6, 64, 2)
    assert (mask[0::2] == [True, False]).all()  # the speaker's turn
    assert (mask[1::2] == [False, True]).all()  # the listener's turn
    assert not np.asarray(traj.terminated[0::2]).any() and np.asarray(traj.terminated[1::2]).all()
    # the listener sees the message the speaker sent, and nothing of the target
    np.testing.assert_array_equal(
        np.argmax(np.asarray(traj.obs.local[1::2, :, 1]), -1), np.asarray(traj.action[0::2, :, 0])
    )
    assert not np.asarray(traj.obs.local[0::2, :, 1]).any()
    target = np.argmax(np.asarray(traj.obs.state[0::2, :, :3]), -1)
    right = np.asarray(traj.action[1::2, :, 1]) == target
    np.testing.assert_array_equal(np.asarray(traj.reward[1::2]), np.stack([right, right], -1))
    assert not np.asarray(traj.reward[0::2]).any()


def test_matrix_game_pays_each_player_its_entry():
    game = MatrixGame("prisoners_dilemma")
    _, state = game.reset(jax.random.key(0))
    for a in range(2):
        for b in range(2):
            _, _, reward, terminated, _, _ = game.step(jax.random.key(1), state, jnp.array([a, b]))
            np.testing.assert_array_equal(reward, game.payoffs[:, a, b])
            assert terminated


@st.composite
def profiles(draw):
    name = draw(st.sampled_from(sorted(GAMES)))
    n = len(GAMES[name][0])
    rows = [draw(st.lists(st.floats(0.01, 1.0), min_size=n, max_size=n)) for _ in range(2)]
    return name, np.asarray(rows) / np.sum(rows, axis=1, keepdims=True)


@settings(max_examples=40, deadline=None)
@given(profiles())
def test_nash_conv_is_the_gain_of_the_best_unilateral_deviation(profile):
    name, p = profile
    game = MatrixGame(name)
    gap = game.nash_conv(p)
    assert gap >= -1e-9
    # a slow reference: each player's best pure deviation, against the other's fixed strategy
    n = game.num_actions
    value = game.values(p)
    best0 = max(game.values([np.eye(n)[a], p[1]])[0] for a in range(n))
    best1 = max(game.values([p[0], np.eye(n)[b]])[1] for b in range(n))
    assert gap == pytest.approx(best0 - value[0] + best1 - value[1], abs=1e-9)


@pytest.mark.parametrize(
    "name, equilibrium",
    [
        ("prisoners_dilemma", [[0, 1], [0, 1]]),
        ("matching_pennies", [[0.5, 0.5], [0.5, 0.5]]),
        ("rock_paper_scissors", [[1 / 3] * 3, [1 / 3] * 3]),
        ("stag_hunt", [[1, 0], [1, 0]]),
    ],
)
def test_the_known_equilibria_have_no_nash_gap(name, equilibrium):
    game = MatrixGame(name)
    assert game.nash_conv(equilibrium) == pytest.approx(0.0, abs=1e-9)
    n = game.num_actions
    assert game.nash_conv([np.eye(n)[0], np.eye(n)[0]]) > 0 or name == "stag_hunt"


@pytest.mark.parametrize(
    "make, error",
    [
        (lambda: MatrixGame("chicken"), "unknown matrix game"),
        (lambda: MatrixGame(np.zeros((2, 2, 3))), r"shape \[2, A, A\]"),
        (lambda: SignallingGame(num_targets=1), "at least 2"),
    ],
)
def test_bad_games_are_refused_by_name(make, error):
    with pytest.raises(ValueError, match=error):
        make()
