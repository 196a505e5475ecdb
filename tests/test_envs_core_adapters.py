"""gymnax and pgx adapters (skipped where the libraries are not installed)."""

import importlib.metadata

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax import envs
from agentic_jax.envs.classic import CartPole


def test_gymnax_cartpole_matches_ours_and_splits_truncation():
    pytest.importorskip("gymnax")
    if int(importlib.metadata.version("gymnax").split(".")[0]) < 1:  # 1.0.1 needs jax < 0.12
        pytest.skip("needs gymnax >= 1.0")
    env = envs.GymnaxEnv("CartPole-v1")
    assert isinstance(env.action_space(), envs.Discrete) and env.observation_space().shape == (4,)
    ours = CartPole()
    obs, state = env.reset(jax.random.key(0))
    our_state = ours.reset(jax.random.key(0))[1].replace(physics=obs)
    for action in (1, 1, 0, 1, 0, 0):
        obs, state, *_ = env.step_env(jax.random.key(0), state, action, env.default_params)
        our_obs, our_state, *_ = ours.step_env(
            jax.random.key(0), our_state, action, ours.default_params
        )
        np.testing.assert_allclose(obs, our_obs, rtol=1e-5, atol=1e-6)
    # A 5-step limit reads as truncation, never termination.
    params = env.default_params.replace(max_steps_in_episode=5)
    tr = envs.rollout(
        env, lambda key, o: jnp.int32(0) + (o[2] > 0), jax.random.key(1), params, 3, 12
    )
    np.testing.assert_array_equal(tr.truncated[:, 0], [0, 0, 0, 0, 1] * 2 + [0, 0])
    assert not bool(tr.terminated.any())
    # Pushing one way only lets the pole fall: termination.
    tr = envs.rollout(env, lambda key, o: jnp.int32(1), jax.random.key(1), None, 3, 40)
    assert bool(tr.terminated.any()) and not bool(tr.truncated.any())


def test_a_gymnax_env_without_truncation_is_refused_by_name():
    """gymnax < 1.0 (all that installs beside jax >= 0.12) folds the time limit into ``done``;
    the adapter would misread it, so it says which version it needs instead of failing mid-step."""

    class OldCartPole:
        default_params = None

    with pytest.raises(
        TypeError, match=r"OldCartPole has no is_truncated: GymnaxEnv needs gymnax >= 1\.0"
    ):
        envs.GymnaxEnv(OldCartPole())


def test_pgx_tic_tac_toe_self_play_view():
    pytest.importorskip("pgx")
    env = envs.PgxEnv("tic_tac_toe")
    assert env.action_space().n == 9 and env.observation_space().shape == (3, 3, 2)
    key, step = jax.random.key(0), jax.jit(env.step)
    obs, state = env.reset(key)
    first = int(state.current_player)
    for move in (0, 3, 1, 4):
        obs, state, reward, terminated, _, info = step(key, state, move)
        assert float(reward) == 0.0 and not bool(terminated)
    obs, state, reward, terminated, truncated, info = step(
        key, state, 2
    )  # top row: the first mover wins
    assert bool(terminated) and not bool(truncated) and float(reward) == 1.0
    assert float(info["rewards"][1 - first]) == -1.0
    assert (
        int(info["final_observation"].sum()) == 5 and int(obs.sum()) == 0
    )  # auto-reset to an empty board
    assert bool(info["legal_action_mask"].shape == (9,))


def test_pgx_board_observations_are_a_bounded_space_of_zeros_and_ones():
    pytest.importorskip("pgx")
    space = envs.PgxEnv("tic_tac_toe").observation_space()
    assert space.dtype == jnp.bool_ and (space.low == 0).all() and (space.high == 1).all()
    samples = jax.vmap(space.sample)(jax.random.split(jax.random.key(0), 64))
    assert samples.dtype == jnp.bool_ and 0.3 < float(samples.mean()) < 0.7  # not all True
