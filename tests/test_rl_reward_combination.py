"""Combining rewards: weighted sums, GDPO's per-component group normalisation, PRM step scores."""

from pathlib import Path

import chex
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import (
    REWARD_COMBINATIONS,
    STEP_AGGREGATIONS,
    aggregate_steps,
    combine_rewards,
    group_advantages,
)

N, G, R = 3, 4, 2
rewards_strategy = hnp.arrays(
    np.float32, (N, G, R), elements=st.sampled_from([0.0, 1.0, 0.25, -3.0, 100.0])
)
weights_strategy = hnp.arrays(np.float32, R, elements=st.floats(0.0, 2.0, width=32))


def _gdpo_reference(rewards, weights, eps=1e-6, ddof=1):
    rewards = np.float64(rewards)
    mean = rewards.mean(axis=1, keepdims=True)
    std = rewards.std(axis=1, ddof=ddof, keepdims=True)
    return np.sum(weights * (rewards - mean) / (std + eps), axis=-1)


class CombineRewardsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(rewards=rewards_strategy, weights=weights_strategy, ddof=st.sampled_from([0, 1]))
    def test_sum_and_gdpo_match_numpy(self, rewards, weights, ddof):
        combine = self.variant(combine_rewards, static_argnames=("method", "eps", "std_ddof"))
        total = combine(rewards, weights)
        chex.assert_shape(total, (N, G))
        chex.assert_type(total, jnp.float32)
        np.testing.assert_allclose(total, np.sum(weights * rewards, axis=-1), rtol=1e-6, atol=1e-4)
        gdpo = combine(rewards, weights, method="gdpo", std_ddof=ddof)
        np.testing.assert_allclose(
            gdpo, _gdpo_reference(rewards, weights, ddof=ddof), rtol=1e-4, atol=1e-4
        )
        np.testing.assert_allclose(np.mean(gdpo, axis=1), 0.0, atol=1e-4)


def test_gdpo_is_group_advantages_per_component_and_keeps_scales_apart():
    # Component 0 is on a scale 100x component 1: summed first, it drowns the second.
    rewards = np.array([[[100.0, 1.0], [0.0, 0.0], [100.0, 0.0], [0.0, 1.0]]], np.float32)
    weights = np.ones(R, np.float32)
    gdpo = combine_rewards(rewards, weights, method="gdpo")
    per_component = [group_advantages(rewards[..., r]) for r in range(R)]
    np.testing.assert_allclose(gdpo, per_component[0] + per_component[1], rtol=1e-6)
    # Each component counts equally: passing only the large-scale one is worth as much as
    # passing only the small-scale one (their plain sum says 100 vs 1).
    np.testing.assert_allclose(gdpo[0, 2], gdpo[0, 3], atol=1e-5)  # up to eps/σ
    assert gdpo[0, 0] > gdpo[0, 2] > gdpo[0, 1]
    total = combine_rewards(rewards, weights)
    assert total[0, 2] > 50 * total[0, 3]
    # All-equal components contribute exactly 0.
    flat = np.concatenate([rewards[..., :1], np.full((1, G, 1), 0.3, np.float32)], axis=-1)
    np.testing.assert_array_equal(combine_rewards(flat, weights, method="gdpo"), per_component[0])


def _slow_aggregate(scores, mask, mode):
    out = np.zeros(scores.shape[0], np.float64)
    for b in range(scores.shape[0]):
        steps = [np.float64(scores[b, s]) for s in range(scores.shape[1]) if mask[b, s]]
        if not steps:
            continue
        out[b] = {"min": min, "product": np.prod, "last": lambda x: x[-1], "mean": np.mean}[mode](
            steps
        )
    return out


class AggregateStepsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(
        scores=hnp.arrays(np.float32, (5, 6), elements=st.floats(0.0, 1.0, width=32)),
        mask=hnp.arrays(np.bool_, (5, 6)),
    )
    def test_every_mode_matches_a_slow_loop(self, scores, mask):
        mask[0] = False  # an episode without any valid step
        garbage = np.where(mask, scores, np.nan).astype(np.float32)
        aggregate_fn = self.variant(aggregate_steps, static_argnames="mode")
        for mode in STEP_AGGREGATIONS:
            aggregated = aggregate_fn(garbage, mask, mode=mode)
            chex.assert_shape(aggregated, (5,))
            chex.assert_type(aggregated, jnp.float32)
            np.testing.assert_allclose(
                aggregated, _slow_aggregate(scores, mask, mode), rtol=1e-5, atol=1e-6, err_msg=mode
            )
            assert aggregated[0] == 0.0, mode


def test_modes_on_a_worked_example():
    scores = np.array([[0.9, 0.5, 0.8, 0.1]], np.float32)
    mask = np.array([[1, 1, 1, 0]])
    expected = {"min": 0.5, "product": 0.36, "last": 0.8, "mean": 2.2 / 3}
    for mode, value in expected.items():
        np.testing.assert_allclose(aggregate_steps(scores, mask, mode), [value], rtol=1e-6)
    assert aggregate_steps(scores, mask) == pytest.approx(0.5)  # min by default


def test_errors_name_the_argument():
    rewards = np.zeros((N, G, R), np.float32)
    with pytest.raises(ValueError, match="unknown method 'mean'; valid values: sum, gdpo"):
        combine_rewards(rewards, np.ones(R), method="mean")
    with pytest.raises(ValueError, match="rewards must be 3-D"):
        combine_rewards(rewards[..., 0], np.ones(R))
    with pytest.raises(ValueError, match=r"weights must have shape \(2,\)"):
        combine_rewards(rewards, np.ones(3))
    with pytest.raises(ValueError, match="unknown mode 'max'; valid values: min, product, last"):
        aggregate_steps(np.zeros((2, 3)), np.ones((2, 3)), "max")
    with pytest.raises(ValueError, match="step_scores must be 2-D"):
        aggregate_steps(np.zeros(3), np.ones(3))
    with pytest.raises(ValueError, match=r"step_mask must have shape \(2, 3\)"):
        aggregate_steps(np.zeros((2, 3)), np.ones((2, 2)))
    assert REWARD_COMBINATIONS == ("sum", "gdpo")


def test_documented():
    docs = (Path(__file__).parents[1] / "docs" / "rl_losses.md").read_text()
    for fn in (combine_rewards, aggregate_steps):
        assert f"`{fn.__name__}(" in docs and "arXiv:" in fn.__doc__, fn.__name__
