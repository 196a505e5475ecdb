"""Curricula: pass-rate band filter, Prioritized Level Replay, hindsight relabelling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.envs.curriculum import (
    PassRateFilter,
    PrioritizedLevelReplay,
    goal_reached,
    hindsight_relabel,
    in_band,
    learnability,
)
from agentic_jax.envs.text import Countdown


def test_in_band_keeps_groups_with_pass_rate_in_band():
    successes = np.array(
        [[1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 1, 0]]
    )
    np.testing.assert_array_equal(in_band(successes), [False, False, False, True, False, True])
    np.testing.assert_array_equal(
        in_band(successes, 0.25, 0.75), [False, False, True, True, True, True]
    )


def test_pass_rate_filter_keeps_exactly_the_in_band_prompts_and_re_estimates():
    solved = np.array([0, 2, 3, 5, 7, 8, 10])  # out of 10 attempts each
    rates = np.append(solved / 10, 0.5)
    filt = PassRateFilter(len(rates), period=10, min_attempts=10)
    update = jax.jit(filt.update)
    state = filt.init()
    assert bool(jnp.all(state.keep))
    tasks = np.arange(len(rates) - 1)  # the last prompt is never played in the first period
    for attempt in range(10):
        assert bool(jnp.all(state.keep))  # no estimate before the period ends
        state = update(state, tasks, (attempt < solved).astype(np.float32))
    np.testing.assert_array_equal(state.keep, [False, False, True, True, True, False, False, True])
    np.testing.assert_allclose(state.rate[:-1], rates[:-1], atol=1e-6)
    assert bool(jnp.isnan(state.rate[-1])) and float(state.attempts.sum()) == 0.0  # a fresh period
    np.testing.assert_allclose(filt.weights(state), np.where(state.keep, 1.0, filt.explore))
    for attempt in range(10):  # the policy improved on prompt 0: re-estimated into the band
        state = update(state, np.zeros(1, np.int32), np.full(1, attempt % 2, np.float32))
    assert bool(state.keep[0]) and float(state.rate[0]) == pytest.approx(0.5)
    assert not bool(state.keep[1])  # too few new outcomes: the old decision stands


def test_plr_prefers_high_scores():
    plr = PrioritizedLevelReplay(6, beta=0.3, rho=0.1, replay_prob=1.0)
    state = plr.mark_sampled(plr.init(), jnp.arange(6))
    state = plr.update(
        state, jnp.arange(6), learnability(jnp.array([0.5, 0.0, 0.4, 1.0, 0.1, 0.2]))
    )
    probs = np.asarray(jax.jit(plr.distribution)(state))
    assert probs.sum() == pytest.approx(1.0) and np.argmax(probs) == 0
    for bad in (dict(beta=0.0), dict(rho=1.5), dict(replay_prob=-0.1)):
        with pytest.raises(ValueError, match="PrioritizedLevelReplay needs"):
            PrioritizedLevelReplay(6, **bad)
    order = np.argsort(-np.asarray(state.scores))
    assert np.all(np.diff(probs[order][:4]) < 0)  # strictly by score rank (levels 1 and 3 tie at 0)
    _, levels = jax.jit(plr.sample, static_argnums=2)(state, jax.random.key(0), 2000)
    counts = np.bincount(np.asarray(levels), minlength=6)
    assert counts[0] > counts[2] > counts[5] > counts[4]


def test_plr_draws_unseen_levels_and_staleness_stays_bounded():
    num_levels, rounds = 12, 300
    scores = jnp.linspace(
        0.0, 0.25, num_levels
    )  # fixed learning potential: level 11 is the favourite

    def run(rho):
        plr = PrioritizedLevelReplay(num_levels, beta=0.1, rho=rho, replay_prob=0.5)

        def body(state, key):
            state, levels = plr.sample(state, key, 2)
            state = plr.update(state, levels, scores[levels])
            return state, jnp.max(state.staleness)

        state, staleness = jax.lax.scan(
            body, plr.init(), jax.random.split(jax.random.key(1), rounds)
        )
        return state, np.asarray(staleness)

    state, with_staleness = run(rho=0.5)
    assert bool(jnp.all(state.seen))  # unseen levels were drawn until none was left
    assert with_staleness[50:].max() <= 40
    _, without = run(rho=0.0)
    assert without.max() > 150  # pure score prioritisation lets low-score levels go stale


def test_hindsight_relabel_gives_reward_one_to_achieved_goals():
    achieved = jnp.array([[0, 0], [1, 0], [1, 1], [2, 1], [9, 9]])  # the last step is padding
    goals, rewards = hindsight_relabel(jax.random.key(0), achieved, length=4, strategy="final")
    np.testing.assert_array_equal(goals, np.tile([2, 1], (5, 1)))
    np.testing.assert_array_equal(rewards, [0, 0, 0, 1, 0])
    for seed in range(5):
        goals, rewards = hindsight_relabel(jax.random.key(seed), achieved, length=4)
        sources = [
            [s for s in range(4) if np.array_equal(achieved[s], g)] for g in np.asarray(goals)[:4]
        ]
        assert all(
            any(s >= t for s in srcs) for t, srcs in enumerate(sources)
        )  # goals come from the future
        np.testing.assert_array_equal(rewards, goal_reached(achieved, goals))
    assert (
        float(rewards[3]) == 1.0
    )  # the last real step can only relabel with its own achieved goal
    with pytest.raises(ValueError):
        hindsight_relabel(jax.random.key(0), achieved, strategy="past")


def test_countdown_relabel_turns_a_legal_miss_into_a_solved_task():
    generator = Countdown(3)
    task = generator.sample(3)
    a, b = task.numbers[:2]
    miss = f"{a} * {b}" if a * b != task.value else f"{a} + {b}"
    content = f"<think>try</think><answer>{miss}</answer>"
    assert generator.reward.host(content, task) < generator.reward.max_value
    relabelled = generator.relabel(task, miss)
    assert relabelled.value == eval(miss) and relabelled.numbers == task.numbers
    assert str(relabelled.value) in relabelled.prompt[-1].content
    assert generator.reward.host(content, relabelled) == pytest.approx(generator.reward.max_value)
    assert (
        generator.relabel(task, f"{max(task.numbers) + 100} + 1") is None
    )  # not from the given numbers
    assert generator.relabel(task, "7 / 2") is None  # inexact division
