"""League self-play on pgx tic-tac-toe: a short training beats a uniformly random player and the
first checkpoint, and the game loop reproduces the known outcome rates of random play."""

import jax
import numpy as np
import pytest

pytest.importorskip("pgx")

from agentic_jax.classic_rl.board_self_play import (
    BoardSelfPlayConfig,
    make_board_self_play,
    match_rates,
    play,
    uniform_player,
)
from agentic_jax.classic_rl.networks import mlp_init
from agentic_jax.envs import PgxEnv


def test_a_short_league_training_beats_a_random_player_and_the_first_checkpoint():
    config = BoardSelfPlayConfig(generations=4, iterations=40, batch=64, eval_games=256)
    league, metrics = jax.jit(make_board_self_play(PgxEnv("tic_tac_toe"), config))(
        jax.random.key(0)
    )
    m = {k: np.asarray(v) for k, v in metrics.items()}
    assert m["vs_random_win"][-1] > 0.6 and m["vs_random_win"][-1] > 2 * m["vs_random_loss"][-1]
    assert m["vs_first_win"][-1] > 0.6
    assert m["vs_random_win"][-1] > m["vs_random_win"][0]  # it kept improving
    for who in ("vs_random", "vs_first"):
        rates = sum(m[f"{who}_{r}"] for r in ("win", "draw", "loss"))
        np.testing.assert_allclose(rates, 1.0, atol=1e-6)
    assert (m["unfinished"] == 0).all()  # nine moves end every game
    assert jax.tree.leaves(league)[0].shape[0] == 5  # the first network and four generations


def test_random_play_has_the_known_tic_tac_toe_outcome_rates():
    """Under uniform random play the first mover wins 58.5 %, the second 28.8 %, 12.7 % draw
    (exact enumeration of the game tree); the learner alternates seats."""
    env = PgxEnv("tic_tac_toe")
    uniform = uniform_player(mlp_init(jax.random.key(0), (18, 8, 9)))
    run = jax.jit(lambda key: match_rates(env, uniform, uniform, key, 4000, 9))
    rates = {k: float(v) for k, v in run(jax.random.key(1)).items()}
    assert rates["draw"] == pytest.approx(0.127, abs=0.025)
    assert rates["win"] == pytest.approx((0.585 + 0.288) / 2, abs=0.03)


def test_the_learner_moves_only_in_its_seat_until_the_game_ends():
    env = PgxEnv("tic_tac_toe")
    params = mlp_init(jax.random.key(0), (18, 8, 9))
    opponents = jax.tree.map(lambda x: np.broadcast_to(x, (6, *x.shape)), params)
    seats = np.array([0, 1, 0, 1, 0, 1])
    games = jax.jit(play, static_argnums=(0, 5))(
        env, params, opponents, seats, jax.random.key(2), 9
    )
    mine, outcome = np.asarray(games["mine"]), np.asarray(games["outcome"])
    assert set(outcome.tolist()) <= {-1.0, 0.0, 1.0} and np.asarray(games["finished"]).all()
    # pgx draws who moves first; the players then alternate, so the learner moves every other step
    for b in range(6):
        steps = np.flatnonzero(mine[:, b])
        assert len(steps) >= 2 and (np.diff(steps) == 2).all()  # a game lasts five moves or more
    legal = np.asarray(games["legal"])
    action = np.asarray(games["action"])
    assert legal[np.arange(9)[:, None], np.arange(6)[None], action][mine].all()


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_moves"):
        BoardSelfPlayConfig(max_moves=0)
    with pytest.raises(ValueError, match="league_size"):
        BoardSelfPlayConfig(league_size=0)
