"""Advantage estimators: group baselines, whitening and token-level GAE."""

import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import GROUP_ESTIMATORS, gae, group_advantages, masked_whiten, token_gae

N, G = 3, 4
JIT_GROUP = jax.jit(group_advantages, static_argnames=("estimator", "scale", "eps", "std_ddof"))
VARIANTS = {"eager": group_advantages, "jit": JIT_GROUP}
rewards_strategy = hnp.arrays(np.float32, (N, G), elements=st.floats(-10.0, 10.0, width=32))
CENTERED = ("grpo", "dr_grpo", "rloo", "reinforce_pp_baseline")


@pytest.fixture(params=sorted(VARIANTS), scope="module")
def advantages_fn(request):
    return VARIANTS[request.param]


def _extras(rewards):
    """Inputs of the estimators that need more than rewards."""
    return {
        "remax": dict(baseline=rewards[:, 0] - 1.0),
        "opo": dict(lengths=jnp.arange(1, rewards.size + 1).reshape(rewards.shape) % 5 + 1),
    }


@given(rewards=rewards_strategy)
def test_centered_estimators_have_zero_mean_per_group(advantages_fn, rewards):
    for estimator in CENTERED:
        advantages = advantages_fn(rewards, estimator=estimator)
        np.testing.assert_allclose(np.mean(advantages, axis=1), 0.0, atol=1e-4, err_msg=estimator)


@given(rewards=rewards_strategy, seed=st.integers(0, 2**16))
def test_estimators_are_permutation_equivariant(rewards, seed):
    rng = np.random.default_rng(seed)
    within, groups = rng.permutation(G), rng.permutation(N)
    extras = _extras(rewards)
    for estimator in GROUP_ESTIMATORS:
        kw = extras.get(estimator, {})
        permuted_kw = {k: v[groups][:, within] if v.ndim == 2 else v[groups] for k, v in kw.items()}
        original = JIT_GROUP(rewards, estimator=estimator, **kw)
        permuted = JIT_GROUP(rewards[groups][:, within], estimator=estimator, **permuted_kw)
        np.testing.assert_allclose(
            permuted, original[groups][:, within], rtol=1e-5, atol=1e-5, err_msg=estimator
        )


def test_two_samples_give_plus_minus_one_over_sqrt_two_or_one(advantages_fn):
    rewards = jnp.array([[0.0, 1.0], [3.0, -5.0]])
    bessel = advantages_fn(rewards)
    np.testing.assert_allclose(
        bessel,
        [[-1 / math.sqrt(2), 1 / math.sqrt(2)], [1 / math.sqrt(2), -1 / math.sqrt(2)]],
        rtol=1e-5,
    )
    population = advantages_fn(rewards, std_ddof=0)
    np.testing.assert_allclose(population, [[-1.0, 1.0], [1.0, -1.0]], rtol=1e-5)


@given(rewards=rewards_strategy)
def test_rloo_equals_the_explicit_leave_one_out_loop(advantages_fn, rewards):
    expected = np.empty((N, G))
    for i in range(N):
        for j in range(G):
            others = [rewards[i, k] for k in range(G) if k != j]
            expected[i, j] = rewards[i, j] - sum(others) / len(others)
    np.testing.assert_allclose(
        advantages_fn(rewards, estimator="rloo"), expected, rtol=1e-5, atol=1e-4
    )


def test_all_equal_rewards_give_zero_advantage_without_nan(advantages_fn):
    rewards = jnp.full((N, G), 0.7)
    extras = _extras(rewards) | {"remax": dict(baseline=rewards[:, 0])}
    for estimator in GROUP_ESTIMATORS:
        for scale in ("group", "batch", "none") if estimator == "grpo" else ("group",):
            advantages = advantages_fn(
                rewards, estimator=estimator, scale=scale, **extras.get(estimator, {})
            )
            np.testing.assert_array_equal(advantages, 0.0, err_msg=f"{estimator}/{scale}")


def test_baselines_and_scales_match_their_definitions():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(N, G)).astype(np.float32)
    lengths = rng.integers(1, 30, (N, G))
    centered = rewards - rewards.mean(1, keepdims=True)
    expected = {
        ("grpo", "group"): centered / (rewards.std(1, ddof=1, keepdims=True) + 1e-6),
        ("grpo", "batch"): centered / (rewards.std(ddof=1) + 1e-6),
        ("grpo", "none"): centered,
        ("dr_grpo", "group"): centered,
        ("reinforce_pp", "group"): (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6),
        ("reinforce_pp_baseline", "group"): centered / (centered.std(ddof=1) + 1e-6),
        ("remax", "group"): rewards - rewards[:, :1],
        ("opo", "group"): rewards
        - (lengths * rewards).sum(1, keepdims=True) / lengths.sum(1, keepdims=True),
    }
    extras = dict(baseline=rewards[:, 0], lengths=lengths)
    for (estimator, scale), value in expected.items():
        kw = {
            k: v
            for k, v in extras.items()
            if (k == "baseline") == (estimator == "remax")
            and (k == "lengths") == (estimator == "opo")
        }
        np.testing.assert_allclose(
            JIT_GROUP(rewards, estimator=estimator, scale=scale, **kw),
            value,
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"{estimator}/{scale}",
        )


def test_errors_name_the_argument_and_the_valid_values():
    rewards = jnp.zeros((N, G))
    with pytest.raises(
        ValueError, match=r"unknown estimator 'ppo'; valid values: grpo, dr_grpo, rloo"
    ):
        group_advantages(rewards, estimator="ppo")
    with pytest.raises(ValueError, match="scale applies to estimator='grpo' only"):
        group_advantages(rewards, estimator="rloo", scale="batch")
    with pytest.raises(ValueError, match="rloo needs a group size of at least 2"):
        group_advantages(rewards[:, :1], estimator="rloo")
    with pytest.raises(ValueError, match="baseline is required for estimator='remax'"):
        group_advantages(rewards, estimator="remax")
    with pytest.raises(ValueError, match=r"lengths must have shape \(3, 4\)"):
        group_advantages(rewards, estimator="opo", lengths=jnp.ones((N, 2)))
    with pytest.raises(ValueError, match="rewards must be 2-D"):
        group_advantages(rewards.ravel())


_WHITEN = jax.jit(masked_whiten, static_argnames=("shift_mean",))


@given(
    values=hnp.arrays(np.float32, (3, 5), elements=st.floats(-100.0, 100.0, width=32)),
    noise=hnp.arrays(np.float32, (3, 5), elements=st.floats(-1e3, 1e3, width=32)),
)
def test_masked_whiten_ignores_masked_entries(values, noise):
    mask = np.array([[0, 1, 1, 0, 0], [1, 0, 1, 1, 0], [0, 0, 0, 1, 1]], bool)
    whitened = _WHITEN(values, mask)
    np.testing.assert_array_equal(_WHITEN(np.where(mask, values, noise), mask), whitened)
    for masked in (
        np.inf,
        np.nan,
    ):  # eager: under jit XLA may turn the products with the mask into selects
        np.testing.assert_allclose(
            masked_whiten(np.where(mask, values, masked), mask), whitened, rtol=1e-6, atol=1e-6
        )
    assert np.all(whitened[~mask] == 0.0)
    np.testing.assert_array_equal(_WHITEN(np.full_like(values, 0.7), mask), 0.0)
    valid = values[mask]
    if valid.std() > 1e-2:
        np.testing.assert_allclose(whitened[mask].mean(), 0.0, atol=1e-4)
        np.testing.assert_allclose(whitened[mask].std(ddof=1), 1.0, rtol=1e-3)
        kept_mean = _WHITEN(values, mask, shift_mean=False)
        np.testing.assert_allclose(kept_mean[mask].mean(), valid.mean(), rtol=1e-4, atol=1e-3)


def _slow_token_gae(rewards, values, mask, gamma, lam):
    """Reference: GAE along each row's valid tokens only, written as a plain loop."""
    advantages = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        idx = np.flatnonzero(mask[b])
        next_value, next_adv = 0.0, 0.0
        for t in idx[::-1]:
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b, t]
            advantages[b, t] = next_adv
    return advantages


_TOKEN_GAE = jax.jit(token_gae, static_argnames=("gamma", "lam"))


@given(
    rewards=hnp.arrays(np.float32, (3, 6), elements=st.floats(-5.0, 5.0, width=32)),
    values=hnp.arrays(np.float32, (3, 6), elements=st.floats(-5.0, 5.0, width=32)),
    garbage=hnp.arrays(np.float32, (3, 6), elements=st.floats(-1e6, 1e6, width=32)),
)
def test_token_gae_ignores_masked_values_and_matches_a_slow_loop(rewards, values, garbage):
    mask = np.array([[0, 1, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 0, 0]], bool)
    advantages, returns = _TOKEN_GAE(rewards, values, mask, gamma=0.9, lam=0.8)
    np.testing.assert_allclose(
        advantages, _slow_token_gae(rewards, values, mask, 0.9, 0.8), rtol=1e-4, atol=1e-4
    )
    corrupted = np.where(mask, values, garbage)
    np.testing.assert_array_equal(
        _TOKEN_GAE(rewards, corrupted, mask, gamma=0.9, lam=0.8)[0], advantages
    )
    np.testing.assert_allclose(returns, np.where(mask, advantages + values, 0.0), rtol=1e-6)


def test_token_gae_on_a_full_row_is_single_stream_gae():
    rng = np.random.default_rng(0)
    rewards, values = (
        rng.normal(size=(1, 5)).astype(np.float32),
        rng.normal(size=(1, 5)).astype(np.float32),
    )
    advantages, _ = token_gae(rewards, values, np.ones((1, 5)), gamma=0.95, lam=0.9)
    single = gae(
        rewards[0], np.append(values[0], 0.0).astype(np.float32), np.full(5, 0.95, np.float32), 0.9
    )
    np.testing.assert_allclose(advantages[0], single, rtol=1e-5)


@st.composite
def _token_rows(draw):
    """rewards, values [B, T], a mask with at least one valid token per row, γ and λ."""
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 7)))
    rewards, values = (
        draw(hnp.arrays(np.float32, shape, elements=st.floats(-5.0, 5.0, width=32)))
        for _ in range(2)
    )
    mask = draw(hnp.arrays(np.bool_, shape))
    mask[:, 0] |= ~mask.any(axis=1)
    gamma = draw(st.sampled_from([0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.5, 0.95, 1.0]))
    return rewards, values, mask, gamma, lam


class TokenGAETest(chex.TestCase):
    """token_gae is `gae` along the valid tokens of each row (one recursion), with and without jit."""

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=6)
    @given(rows=_token_rows())
    def test_an_all_ones_row_is_gae_with_a_zero_bootstrap_value(self, rows):
        rewards, values, _, gamma, lam = rows
        batch, length = rewards.shape
        token_fn = self.variant(token_gae, static_argnames=("gamma", "lam"))
        advantages, returns = token_fn(
            rewards, values, np.ones((batch, length)), gamma=gamma, lam=lam
        )
        chex.assert_shape((advantages, returns), (batch, length))
        chex.assert_type((advantages, returns), jnp.float32)
        bootstrapped = np.concatenate([values, np.zeros((batch, 1), np.float32)], axis=1)
        single = self.variant(jax.vmap(gae, in_axes=(0, 0, None, None)))(
            rewards, bootstrapped, np.full(length, gamma, np.float32), np.float32(lam)
        )
        chex.assert_trees_all_close(advantages, single, rtol=1e-6, atol=1e-6)
        chex.assert_trees_all_close(returns, single + values, rtol=1e-6, atol=1e-6)

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=6)
    @given(rows=_token_rows())
    def test_a_masked_row_is_gae_over_its_valid_tokens(self, rows):
        rewards, values, mask, gamma, lam = rows
        token_fn = self.variant(token_gae, static_argnames=("gamma", "lam"))
        advantages, returns = token_fn(rewards, values, mask, gamma=gamma, lam=lam)
        gae_fn = self.variant(gae)
        expected = np.zeros_like(rewards)
        for row, valid in enumerate(mask):
            count = int(valid.sum())
            expected[row, valid] = gae_fn(
                rewards[row, valid],
                np.append(values[row, valid], np.float32(0.0)),
                np.full(count, gamma, np.float32),
                lam,
            )
        chex.assert_trees_all_close(advantages, expected, rtol=1e-5, atol=1e-5)
        chex.assert_trees_all_close(
            returns, np.where(mask, expected + values, 0.0), rtol=1e-5, atol=1e-5
        )
