"""League self-play in rock-paper-scissors: the league's mixture approaches the Nash equilibrium
while best responses to the latest self cycle, at the same budget."""

import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.classic_rl.self_play import (
    SelfPlayConfig,
    league_mixtures,
    make_league_self_play,
)
from agentic_jax.envs import MatrixGame


def test_the_league_approaches_nash_where_the_latest_self_cycles():
    game = MatrixGame("rock_paper_scissors")
    gaps, leagues = {}, {}
    for size in (None, 1):  # every past generation; the latest one only
        config = SelfPlayConfig(generations=24, iterations=80, league_size=size)
        league = np.asarray(jax.jit(make_league_self_play(game, config))(jax.random.key(0)))
        mix = np.asarray(league_mixtures(league, size))[-1]
        gaps[size], leagues[size] = game.nash_conv([mix, mix]), league
    assert gaps[None] < 0.35 and gaps[None] < 0.25 * gaps[1]
    # against its latest self each generation plays the move that beats the previous one
    moves = leagues[1][1:].argmax(-1)
    beats = {0: 1, 1: 2, 2: 0}  # paper beats rock, scissors paper, rock scissors
    assert all(beats[a] == b for a, b in itertools.pairwise(moves))


@settings(max_examples=30, deadline=None)
@given(
    league=hnp.arrays(np.float32, (6, 3), elements=st.floats(0.0, 1.0, width=32)),
    size=st.none() | st.integers(1, 7),
)
def test_league_mixtures_average_the_members_in_the_window(league, size):
    got = np.asarray(league_mixtures(league, size))
    for g in range(6):
        low = 0 if size is None else max(0, g + 1 - size)
        np.testing.assert_allclose(got[g], league[low : g + 1].mean(0), rtol=1e-5, atol=1e-6)


def test_asymmetric_games_and_bad_settings_are_refused():
    with pytest.raises(ValueError, match="symmetric"):
        make_league_self_play(MatrixGame([[[1, 0], [0, 1]], [[0, 0], [0, 0]]]))
    with pytest.raises(ValueError, match="league_size"):
        SelfPlayConfig(league_size=0)
