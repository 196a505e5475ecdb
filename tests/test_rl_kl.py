"""KL estimators, KL-in-reward placement and KL-coefficient controllers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import (
    KL_ESTIMATORS,
    adaptive_kl_controller,
    fixed_kl_controller,
    kl_penalized_rewards,
    kl_penalty,
)

JIT_KL = jax.jit(kl_penalty, static_argnames=("kind", "clamp"))
VARIANTS = {"eager": kl_penalty, "jit": JIT_KL}
# Log-probs on a 1/64 grid: distinct values differ by far more than float32 resolution.
grid_logps = hnp.arrays(np.float32, 8, elements=st.integers(-64 * 40, 0).map(lambda i: i / 64))


@pytest.fixture(params=sorted(VARIANTS), scope="module")
def kl_fn(request):
    return VARIANTS[request.param]


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_k1_and_k3_are_unbiased_under_monte_carlo_sampling(kind):
    p = jax.nn.log_softmax(jnp.array([2.0, 0.5, -1.0, 0.0, 1.0, -3.0]))
    q = jax.nn.log_softmax(jnp.array([0.0, 1.0, 0.5, -2.0, 1.5, 0.0]))
    exact = float(jnp.sum(jnp.exp(p) * (p - q)))
    tokens = jax.random.categorical(jax.random.key(0), p, shape=(200_000,))
    estimates = np.asarray(JIT_KL(p[tokens], q[tokens], kind=kind), np.float64)
    standard_error = estimates.std() / np.sqrt(estimates.size)
    assert abs(estimates.mean() - exact) < 4 * standard_error
    if kind == "k3":  # the low-variance estimator
        k1 = np.asarray(JIT_KL(p[tokens], q[tokens], kind="k1"))
        assert estimates.std() < k1.std()


@given(logp=grid_logps, ref_logp=grid_logps)
def test_k2_and_k3_are_nonnegative_and_zero_iff_equal(kl_fn, logp, ref_logp):
    for kind in ("k2", "k3", "k3+", "abs"):
        values = np.asarray(kl_fn(logp, ref_logp, kind))
        assert np.all(values >= 0.0), kind
        np.testing.assert_array_equal(values == 0.0, logp == ref_logp, err_msg=kind)
        np.testing.assert_array_equal(kl_fn(logp, logp, kind), 0.0)


@jax.jit
def _values_and_grads(logp, ref_logp):
    def one(kind):
        return jax.value_and_grad(lambda x: kl_penalty(x, ref_logp, kind).sum())(logp), kl_penalty(
            logp, ref_logp, kind
        )

    return {kind: one(kind) for kind in KL_ESTIMATORS}


@given(logp=grid_logps, ref_logp=grid_logps)
def test_straight_through_estimators_follow_the_k2_gradient(logp, ref_logp):
    results = _values_and_grads(logp, ref_logp)
    grad = {kind: g for kind, ((_, g), _) in results.items()}
    value = {kind: v for kind, (_, v) in results.items()}
    np.testing.assert_allclose(grad["k3+"], grad["k2"], rtol=1e-6)
    np.testing.assert_allclose(grad["k1+"], grad["k2"], rtol=1e-6)
    np.testing.assert_allclose(value["k3+"], value["k3"], rtol=1e-6)
    np.testing.assert_allclose(value["k1+"], value["k1"], rtol=1e-6)
    assert not np.allclose(grad["k3"], grad["k2"]) or np.allclose(logp, ref_logp)


def test_values_match_their_formulas_and_clamp_bounds_them(kl_fn):
    logp, ref = jnp.array([-1.0, -3.0, 0.0, -1e4]), jnp.array([-2.0, -1.0, -1e4, 0.0])
    x = np.float64(logp) - np.float64(ref)
    np.testing.assert_allclose(kl_fn(logp, ref, "k1"), x, rtol=1e-6)
    np.testing.assert_allclose(kl_fn(logp, ref, "k2"), x**2 / 2, rtol=1e-6)
    np.testing.assert_allclose(kl_fn(logp, ref, "abs"), np.abs(x), rtol=1e-6)
    np.testing.assert_allclose(kl_fn(logp, ref, "k3")[:2], np.exp(-x[:2]) - 1 + x[:2], rtol=1e-6)
    for kind in KL_ESTIMATORS:
        values = kl_fn(logp, ref, kind)
        assert np.all(np.isfinite(values)), kind
        assert np.all(np.abs(kl_fn(logp, ref, kind, clamp=10.0)) <= 10.0), kind
    with pytest.raises(
        ValueError, match=r"unknown kind 'k4'; valid values: k1, k2, k3, abs, k1\+, k3\+"
    ):
        kl_penalty(logp, ref, "k4")
    with pytest.raises(ValueError, match=r"ref_logp must have shape \(4,\)"):
        kl_penalty(logp, ref[:2])


def test_k3_beyond_the_clamp_never_rewards_moving_away_from_the_reference(kl_fn):
    logp = jnp.array([-1e9, -1e4, -30.0, -2.0, 0.0, 2.0, 30.0, 1e4])
    ref = jnp.zeros_like(logp)
    values, grad = kl_fn(logp, ref, "k3"), jax.grad(lambda lp: kl_fn(lp, ref, "k3").sum())(logp)
    assert np.all(values >= 0.0)
    # Non-increasing towards x = 0 from either side, and descent never moves log π away from log π_ref.
    assert np.all(np.diff(values[:5]) <= 0.0) and np.all(np.diff(values[4:]) >= 0.0)
    assert np.all(grad * np.sign(logp - ref) >= 0.0)


def test_kl_in_the_reward_is_per_token_and_detached():
    rewards = jnp.array([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    logp, ref = jnp.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -9.0]]), jnp.full((2, 3), -1.5)
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    shaped = kl_penalized_rewards(rewards, logp, ref, mask, kl_coef=0.1)
    np.testing.assert_allclose(shaped, rewards - 0.1 * (logp - ref) * mask, rtol=1e-6)
    grad = jax.grad(lambda lp: kl_penalized_rewards(rewards, lp, ref, mask, kl_coef=0.1).sum())(
        logp
    )
    np.testing.assert_array_equal(grad, 0.0)


def test_fixed_controller_keeps_its_coefficient():
    controller = fixed_kl_controller(0.05)
    coef = controller.init()
    assert jax.jit(controller.update)(coef, 3.0, 256) == pytest.approx(0.05)


def test_adaptive_controller_moves_towards_the_target_with_bounded_steps():
    controller = adaptive_kl_controller(0.1, target_kl=6.0, horizon=10_000)
    update = jax.jit(controller.update)
    coef = controller.init()
    assert update(coef, 12.0, 1000) == pytest.approx(0.1 * (1 + 0.2 * 0.1))  # error clipped at +20%
    assert update(coef, 6.3, 1000) == pytest.approx(0.1 * (1 + 0.05 * 0.1))
    assert update(coef, 0.0, 1000) == pytest.approx(0.1 * (1 - 0.2 * 0.1))
    assert update(coef, 6.0, 1000) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="horizon"):
        adaptive_kl_controller(0.1, target_kl=6.0, horizon=0)
