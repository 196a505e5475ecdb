"""Off-policy correction: importance weights from the sampler's (behaviour) log-probs."""

import itertools
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import IMPORTANCE_LEVELS, IMPORTANCE_METHODS, importance_weights, policy_loss

B, T = 3, 5
MASK = np.arange(T)[None, :] < np.array([5, 3, 1])[:, None]
CASES = list(itertools.product(IMPORTANCE_METHODS, IMPORTANCE_LEVELS))
STATIC = ("method", "level", "cap")


def _reference(logp, behaviour_logp, mask, method, level, cap):
    """float64 weights and metrics from the formulas."""
    log_ratio = np.where(mask, np.clip(np.float64(logp) - behaviour_logp, -20, 20), 0.0)
    if level == "token":
        unit_log_ratio, units = log_ratio, mask
    else:
        unit_log_ratio, units = np.clip(log_ratio.sum(axis=1), -20, 20), mask.any(axis=1)
    ratio = np.exp(unit_log_ratio)
    weights = np.minimum(ratio, cap) if method == "tis" else np.where(ratio <= cap, ratio, 0.0)
    weights = np.where(units, weights, 0.0)
    unit_weights = weights[units]
    per_token = weights if level == "token" else weights[:, None] * mask
    metrics = {
        "mismatch_mean": np.abs(log_ratio)[mask].mean(),
        "mismatch_max": np.abs(log_ratio)[mask].max(),
        "ess": unit_weights.sum() ** 2 / (unit_weights.size * np.sum(unit_weights**2))
        if np.any(unit_weights > 0)
        else np.nan,
        "capped_fraction": np.mean(ratio[units] > cap),
        "weight_mean": unit_weights.mean(),
    }
    return per_token, metrics


class ImportanceWeightsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_identical_log_probs_give_weights_of_exactly_one(self):
        rng = np.random.default_rng(0)
        logp = -rng.uniform(0.0, 30.0, (B, T)).astype(np.float32)
        padded = np.where(MASK, logp, -np.inf).astype(np.float32)
        behaviour = np.where(MASK, logp, np.nan).astype(np.float32)
        weights_fn = self.variant(importance_weights, static_argnames=STATIC)
        for method, level in CASES:
            weights, metrics = weights_fn(padded, behaviour, MASK, method=method, level=level)
            chex.assert_shape(weights, (B, T))
            chex.assert_type(weights, jnp.float32)
            np.testing.assert_array_equal(weights, MASK.astype(np.float32), err_msg=method + level)
            for key, value in dict(
                mismatch_mean=0, mismatch_max=0, mismatch_kl=0, ess=1, capped_fraction=0
            ).items():
                assert metrics[key] == value, (method, level, key)
            assert metrics["weight_mean"] == 1.0

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=6)
    @given(
        logp=hnp.arrays(np.float32, (B, T), elements=st.floats(-8.0, 0.0, width=32)),
        shift=hnp.arrays(np.float32, (B, T), elements=st.floats(-1.5, 1.5, width=32)),
        cap=st.sampled_from([1.0, 1.5, 2.0, 5.0]),
    )
    def test_weights_and_metrics_match_the_formulas(self, logp, shift, cap):
        behaviour = (logp - shift).astype(np.float32)
        weights_fn = self.variant(importance_weights, static_argnames=STATIC)
        for method, level in CASES:
            weights, metrics = weights_fn(
                logp, behaviour, MASK, method=method, level=level, cap=cap
            )
            expected, expected_metrics = _reference(logp, behaviour, MASK, method, level, cap)
            np.testing.assert_allclose(weights, expected, rtol=1e-5, atol=1e-6)
            for key, value in expected_metrics.items():
                if np.isnan(value):  # every unit dropped by mis: no ESS; ours reports 0
                    assert metrics[key] == 0.0, key
                    continue
                np.testing.assert_allclose(metrics[key], value, rtol=1e-4, atol=1e-5, err_msg=key)
            assert 0.0 <= metrics["ess"] <= 1.0 + 1e-6
            assert np.all(np.asarray(weights) <= cap * (1 + 1e-6))


def test_sequence_ratio_is_the_product_of_token_ratios_and_mis_drops_whole_sequences():
    logp = np.log(np.array([[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]], np.float32))
    behaviour = np.log(np.array([[0.25, 0.5, 0.5], [0.25, 0.25, 0.5]], np.float32))
    mask = np.ones((2, 3), bool)
    tis, _ = importance_weights(logp, behaviour, mask, level="sequence", cap=3.0)
    np.testing.assert_allclose(tis, [[2.0] * 3, [3.0] * 3], rtol=1e-6)  # ratios 2 and 4 → 3
    mis, metrics = importance_weights(
        logp, behaviour, mask, method="mis", level="sequence", cap=3.0
    )
    np.testing.assert_allclose(mis, [[2.0] * 3, [0.0] * 3], rtol=1e-6)
    assert metrics["capped_fraction"] == 0.5
    np.testing.assert_allclose(metrics["ess"], 0.5, rtol=1e-6)  # one of two sequences kept


def test_weights_are_stop_gradient_and_finite_for_extreme_log_probs():
    logp = jnp.array([[-1e4, 0.0, -1e-6], [-30.0, -1e4, 0.0]])
    behaviour = jnp.array([[0.0, -1e4, -1e-6], [-1e4, -1e-6, -jnp.inf]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    for method, level in CASES:

        def total(lp, method=method, level=level):
            weights, metrics = importance_weights(lp, behaviour, mask, method=method, level=level)
            return jnp.sum(weights) + sum(metrics.values()), (weights, metrics)

        grad, (weights, metrics) = jax.grad(total, has_aux=True)(logp)
        assert np.all(grad == 0.0), (method, level)
        assert np.all(np.isfinite(weights)) and all(np.isfinite(v) for v in metrics.values())
        assert metrics["mismatch_max"] == 20.0  # clamped like the policy losses' log-ratios


# A categorical policy over four actions, a fixed advantage per action, and a perturbed sampler
# (one action's ratio π/μ ≈ 3.7 exceeds the cap, so tis truncates it and mis drops it).
THETA = jnp.array([1.0, 0.0, -0.5, 0.5])
PERTURBATION = jnp.array([0.8, -0.2, -0.9, 0.1])
ADVANTAGE = jnp.array([1.0, -0.5, 0.3, -1.0])


def _on_policy_gradient():
    """E_π[A·∇log π] = ∇_θ Σ_a sg(π_a)·A_a·log π_a, exactly."""
    return jax.grad(
        lambda theta: jnp.sum(
            jax.lax.stop_gradient(jax.nn.softmax(theta)) * ADVANTAGE * jax.nn.log_softmax(theta)
        )
    )(THETA)


@pytest.mark.parametrize("method", IMPORTANCE_METHODS)
def test_corrected_monte_carlo_gradient_is_closer_to_the_on_policy_gradient(method):
    behaviour = jax.nn.log_softmax(THETA + PERTURBATION)
    actions = jax.random.categorical(jax.random.key(0), behaviour, shape=(100_000,))

    @jax.jit
    def estimates(theta):
        logp = jax.nn.log_softmax(theta)[actions][:, None]  # one token per sequence
        weights, _ = importance_weights(
            logp, behaviour[actions][:, None], jnp.ones_like(logp), method=method, cap=2.0
        )
        surrogate = ADVANTAGE[actions][:, None] * logp
        return jnp.mean(weights * surrogate), jnp.mean(surrogate)

    corrected, uncorrected = (
        jax.grad(lambda theta, i=i: estimates(theta)[i])(THETA) for i in range(2)
    )
    exact = _on_policy_gradient()
    corrected_error = np.linalg.norm(corrected - exact)
    uncorrected_error = np.linalg.norm(uncorrected - exact)
    assert corrected_error < 0.5 * uncorrected_error, (corrected_error, uncorrected_error)


@pytest.mark.parametrize("method", IMPORTANCE_METHODS)
def test_sequence_level_correction_has_a_smaller_bias_in_exact_expectation(method):
    """Two-token sequences, R = A(y_1) + A(y_2): E_μ[w·R·∇log π(y)] by enumerating all pairs."""
    behaviour = jax.nn.log_softmax(THETA + PERTURBATION)
    pairs = jnp.array(list(itertools.product(range(4), repeat=2)))
    returns = ADVANTAGE[pairs].sum(axis=1)
    sampler_probability = jnp.exp(behaviour[pairs].sum(axis=1))

    def expected_gradient(theta, corrected):
        logp = jax.nn.log_softmax(theta)[pairs]
        weights, _ = importance_weights(
            logp, behaviour[pairs], jnp.ones_like(logp), method=method, level="sequence", cap=3.0
        )
        weight = weights[:, 0] if corrected else 1.0
        return jnp.sum(sampler_probability * weight * returns * logp.sum(axis=1))

    def on_policy(theta):
        logp = jax.nn.log_softmax(theta)[pairs].sum(axis=1)
        return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * returns * logp)

    exact = jax.grad(on_policy)(THETA)
    corrected = jax.grad(expected_gradient)(THETA, True)
    uncorrected = jax.grad(expected_gradient)(THETA, False)
    assert np.linalg.norm(corrected - exact) < 0.25 * np.linalg.norm(uncorrected - exact)


@pytest.mark.parametrize(
    "loss_type", ["ppo", "grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "gpg", "gspo_token"]
)
def test_token_surrogates_are_positively_homogeneous_in_the_advantage(loss_type):
    """ℓ_t(w·A_t) = w·ℓ_t(A_t) for w ≥ 0: multiplying advantages by weights weights the tokens."""
    rng = np.random.default_rng(1)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, 64), jnp.float32)
    old_logp = logp + jnp.asarray(rng.uniform(-0.6, 0.6, 64), jnp.float32)  # clipped ones too
    advantages = jnp.asarray(rng.normal(size=64), jnp.float32)
    weights = jnp.asarray(np.where(rng.uniform(size=64) < 0.2, 0.0, rng.uniform(0, 3, 64)))

    @jax.jit
    def per_token(advantages):
        def one(lp, old, adv):
            one_token = (lp[None, None], old[None, None], adv[None, None], jnp.ones((1, 1)))
            return policy_loss(*one_token, loss_type=loss_type).total

        return jax.vmap(one)(logp, old_logp, advantages)

    np.testing.assert_allclose(
        per_token(weights * advantages), weights * per_token(advantages), rtol=1e-5, atol=1e-7
    )


def test_errors_name_the_argument():
    logp = jnp.zeros((B, T))
    with pytest.raises(ValueError, match="unknown method 'is'; valid values: tis, mis"):
        importance_weights(logp, logp, MASK, method="is")
    with pytest.raises(ValueError, match="unknown level 'step'; valid values: token, sequence"):
        importance_weights(logp, logp, MASK, level="step")
    with pytest.raises(ValueError, match="cap must be >= 1 for method='tis'"):
        importance_weights(logp, logp, MASK, cap=0.5)
    for method in IMPORTANCE_METHODS:
        with pytest.raises(ValueError, match="cap must lie in"):
            importance_weights(logp, logp, MASK, method=method, cap=0.0)
    with pytest.raises(ValueError, match="logp must be 2-D"):
        importance_weights(logp[0], logp[0], MASK[0])
    with pytest.raises(ValueError, match=r"behaviour_logp must have shape \(3, 5\)"):
        importance_weights(logp, logp[:, :2], MASK)
    with pytest.raises(ValueError, match=r"mask must have shape \(3, 5\)"):
        importance_weights(logp, logp, MASK[:2])
    with pytest.raises(ValueError, match="behaviour_logp must be a floating-point array"):
        importance_weights(logp, jnp.zeros((B, T), jnp.int32), MASK)


def test_documented():
    docs = (Path(__file__).parents[1] / "docs" / "rl_losses.md").read_text()
    assert "`importance_weights(" in docs and "arXiv:1802.01561" in importance_weights.__doc__
