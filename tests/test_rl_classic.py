"""Classic single-stream RL: returns, GAE, TD/Q losses, surrogate and value losses, shaping."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import (
    clipped_surrogate_loss,
    double_q_learning_loss,
    entropy_loss,
    gae,
    lambda_returns,
    potential_shaping,
    ppo_value_loss,
    q_learning_loss,
    reinforce_loss,
    td_error,
    td_lambda,
)

T = 6
floats = hnp.arrays(np.float32, T, elements=st.floats(-5.0, 5.0, width=32))
discounts = hnp.arrays(np.float32, T, elements=st.sampled_from([0.0, 0.5, 0.9, 1.0]))
JIT_GAE = jax.jit(gae)


def _slow_gae(rewards, values, discounts, lam):
    advantages, next_advantage = np.zeros(len(rewards)), 0.0
    for t in reversed(range(len(rewards))):
        delta = rewards[t] + discounts[t] * values[t + 1] - values[t]
        next_advantage = delta + discounts[t] * lam[t] * next_advantage
        advantages[t] = next_advantage
    return advantages


def _monte_carlo_returns(rewards, discounts, bootstrap):
    returns, g = np.zeros(len(rewards)), bootstrap
    for t in reversed(range(len(rewards))):
        g = rewards[t] + discounts[t] * g
        returns[t] = g
    return returns


def _stream(length, low=-5.0, high=5.0):
    return hnp.arrays(np.float32, length, elements=st.floats(low, high, width=32))


@st.composite
def _trajectories(draw, max_length=8):
    """(r_t, values [T+1], discount_t) of a random length T, terminals included."""
    length = draw(st.integers(1, max_length))
    discount_t = hnp.arrays(np.float32, length, elements=st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    return draw(_stream(length)), draw(_stream(length + 1)), draw(discount_t)


class SingleStreamTest(chex.TestCase):
    """The single-stream functions with and without jit (chex variants), rlax-style identities."""

    @chex.variants(with_jit=True, without_jit=True)
    @given(
        rewards=floats,
        values=hnp.arrays(np.float32, T + 1, elements=st.floats(-5, 5, width=32)),
        discounts=discounts,
        lam=hnp.arrays(np.float32, T, elements=st.floats(0.0, 1.0, width=32)),
    )
    def test_gae_matches_a_slow_loop_and_its_limits(self, rewards, values, discounts, lam):
        gae_fn = self.variant(gae)
        np.testing.assert_allclose(
            gae_fn(rewards, values, discounts, lam),
            _slow_gae(rewards, values, discounts, lam),
            rtol=1e-4,
            atol=1e-4,
        )
        monte_carlo = _monte_carlo_returns(rewards, discounts, values[-1]) - values[:-1]
        np.testing.assert_allclose(
            gae_fn(rewards, values, discounts, 1.0), monte_carlo, rtol=1e-4, atol=1e-4
        )
        np.testing.assert_array_equal(
            gae_fn(rewards, values, discounts, 1), gae_fn(rewards, values, discounts, 1.0)
        )
        np.testing.assert_allclose(
            gae_fn(rewards, values, discounts, 0.0),
            td_error(values[:-1], rewards, discounts, values[1:]),
            rtol=1e-5,
            atol=1e-5,
        )

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(trajectory=_trajectories())
    def test_gae_identities(self, trajectory):
        """λ = 1: discounted Monte-Carlo returns minus values; λ = 0: the one-step TD error;
        any λ: λ-returns minus values. Per-step λ of ones / zeros is the same as the scalar."""
        r_t, values, discount_t = trajectory
        length = r_t.shape[0]
        gae_fn, td_fn = self.variant(gae), self.variant(td_error)
        returns_fn = self.variant(lambda_returns)
        v_tm1, v_t = values[:-1], values[1:]
        monte_carlo = _monte_carlo_returns(r_t, discount_t, values[-1]) - v_tm1
        for lambda_ in (1.0, np.ones(length, np.float32)):
            advantages = gae_fn(r_t, values, discount_t, lambda_)
            chex.assert_shape(advantages, (length,))
            chex.assert_type(advantages, jnp.float32)
            chex.assert_trees_all_close(advantages, monte_carlo, rtol=1e-4, atol=1e-4)
        td = td_fn(v_tm1, r_t, discount_t, v_t)
        for lambda_ in (0.0, np.zeros(length, np.float32)):
            chex.assert_trees_all_close(
                gae_fn(r_t, values, discount_t, lambda_), td, rtol=1e-5, atol=1e-5
            )
        chex.assert_trees_all_close(
            gae_fn(r_t, values, discount_t, 0.6) + v_tm1,
            returns_fn(r_t, discount_t, v_t, 0.6),
            rtol=1e-4,
            atol=1e-4,
        )

    @chex.variants(with_jit=True, without_jit=True)
    def test_every_function_is_float32_per_step_for_any_float_input(self):
        """bfloat16 in, float32 out, one entry per step (a transition for the Q losses)."""
        rng = np.random.default_rng(0)

        def stream(length=T):
            return jnp.asarray(rng.normal(size=length), jnp.bfloat16)

        r_t, v_tm1, v_t, discount_t = stream(), stream(), stream(), jnp.full(T, 0.9, jnp.bfloat16)
        logits = jnp.asarray(rng.normal(size=(T, 3)), jnp.bfloat16)
        per_step = {
            "td_error": self.variant(td_error)(v_tm1, r_t, discount_t, v_t),
            "lambda_returns": self.variant(lambda_returns)(r_t, discount_t, v_t, 0.9),
            "td_lambda": self.variant(td_lambda)(v_tm1, r_t, discount_t, v_t, 0.9),
            "gae": self.variant(gae)(r_t, stream(T + 1), discount_t, 0.9),
            "reinforce_loss": self.variant(reinforce_loss)(v_tm1, r_t, v_t),
            "entropy_loss": self.variant(entropy_loss)(logits),
            "clipped_surrogate_loss": self.variant(clipped_surrogate_loss)(jnp.exp(v_t), r_t),
            "ppo_value_loss": self.variant(ppo_value_loss)(v_t, v_tm1, r_t),
            "potential_shaping": self.variant(potential_shaping)(r_t, discount_t, v_tm1, v_t),
        }
        q_args = (logits, jnp.zeros(T, jnp.int32), r_t, discount_t, logits[::-1])
        per_step["q_learning_loss"] = self.variant(jax.vmap(q_learning_loss))(*q_args)
        per_step["double_q_learning_loss"] = self.variant(jax.vmap(double_q_learning_loss))(
            *q_args, logits
        )
        chex.assert_tree_shape_prefix(per_step, (T,))
        chex.assert_trees_all_equal_shapes_and_dtypes(
            per_step, {name: jnp.zeros(T, jnp.float32) for name in per_step}
        )
        chex.assert_tree_all_finite(per_step)


@given(
    rewards=floats,
    values=hnp.arrays(np.float32, T + 1, elements=st.floats(-5, 5, width=32)),
    discounts=discounts,
)
def test_gae_plus_values_are_lambda_returns(rewards, values, discounts):
    returns = jax.jit(lambda_returns)(rewards, discounts, values[1:], 0.7)
    np.testing.assert_allclose(
        JIT_GAE(rewards, values, discounts, 0.7) + values[:-1], returns, rtol=1e-4, atol=1e-4
    )
    np.testing.assert_allclose(
        td_lambda(values[:-1], rewards, discounts, values[1:], 0.7),
        returns - values[:-1],
        rtol=1e-5,
        atol=1e-5,
    )


def test_td_errors_do_not_differentiate_their_targets():
    v_tm1, r_t, discount_t, v_t = (
        jnp.ones(T),
        jnp.arange(T, dtype=jnp.float32),
        jnp.full(T, 0.9),
        jnp.full(T, 2.0),
    )
    grads = jax.grad(lambda a, b: td_lambda(a, r_t, discount_t, b, 0.5).sum(), argnums=(0, 1))(
        v_tm1, v_t
    )
    np.testing.assert_array_equal(grads[0], -1.0)
    np.testing.assert_array_equal(grads[1], 0.0)
    batched_gae = jax.vmap(gae, in_axes=(0, 0, 0, None))
    batched = batched_gae(
        jnp.stack([r_t, -r_t]), jnp.ones((2, T + 1)), jnp.stack([discount_t] * 2), 0.9
    )
    np.testing.assert_allclose(batched[1], gae(-r_t, jnp.ones(T + 1), discount_t, 0.9), rtol=1e-6)


def test_q_learning_losses_use_max_and_double_q_targets():
    q_tm1, q_t = jnp.array([1.0, 2.0, 3.0]), jnp.array([0.0, 5.0, 4.0])
    selector = jnp.array([9.0, 0.0, 1.0])
    q = jax.jit(q_learning_loss)(q_tm1, jnp.int32(1), jnp.float32(1.0), jnp.float32(0.5), q_t)
    assert q == pytest.approx(0.5 * (1.0 + 0.5 * 5.0 - 2.0) ** 2)
    double = double_q_learning_loss(
        q_tm1, jnp.int32(1), jnp.float32(1.0), jnp.float32(0.5), q_t, selector
    )
    assert double == pytest.approx(0.5 * (1.0 + 0.5 * 0.0 - 2.0) ** 2)
    grad = jax.grad(lambda q: q_learning_loss(q_tm1, jnp.int32(2), 1.0, 0.5, q))(q_t)
    np.testing.assert_array_equal(grad, 0.0)
    batch = jax.vmap(q_learning_loss)(
        jnp.stack([q_tm1] * 2), jnp.array([0, 2]), jnp.ones(2), jnp.zeros(2), jnp.stack([q_t] * 2)
    )
    np.testing.assert_allclose(batch, [0.0, 2.0])
    with pytest.raises(ValueError, match=r"q_t must have shape \(3,\), got \(2,\)"):
        q_learning_loss(q_tm1, jnp.int32(1), 1.0, 0.5, q_t[:2])


def test_reinforce_baseline_changes_the_weight_but_gets_no_gradient():
    logp, returns, baseline = (
        jnp.array([-1.0, -2.0, -0.5]),
        jnp.array([3.0, 1.0, 2.0]),
        jnp.array([2.0, 2.0, 2.0]),
    )
    np.testing.assert_allclose(
        reinforce_loss(logp, returns, baseline), -logp * (returns - baseline)
    )
    np.testing.assert_allclose(reinforce_loss(logp, returns), -logp * returns)
    grad_logp, grad_b = jax.grad(
        lambda lp, b: reinforce_loss(lp, returns, b).sum(), argnums=(0, 1)
    )(logp, baseline)
    np.testing.assert_allclose(grad_logp, -(returns - baseline))
    np.testing.assert_array_equal(grad_b, 0.0)


def test_entropy_loss_is_minus_entropy():
    logits = jnp.array([[0.0, 0.0, 0.0, 0.0], [10.0, 0.0, 0.0, 0.0]])
    losses = entropy_loss(logits)
    assert losses[0] == pytest.approx(-np.log(4.0))
    p = np.exp(logits[1]) / np.exp(logits[1]).sum()
    assert losses[1] == pytest.approx(np.sum(p * np.log(p)), rel=1e-4)
    # Invalid actions masked with −inf logits: the entropy of the valid ones, and their gradient.
    masked = jnp.array([1.0, -jnp.inf, 0.5, -jnp.inf])
    value, grad = jax.value_and_grad(entropy_loss)(masked)
    expected, expected_grad = jax.value_and_grad(entropy_loss)(masked[::2])
    assert value == pytest.approx(expected)
    np.testing.assert_allclose(grad[::2], expected_grad, rtol=1e-6)
    np.testing.assert_array_equal(grad[1::2], 0.0)


def test_clipped_surrogate_and_value_losses_match_their_definitions():
    ratio, adv = jnp.array([0.5, 1.0, 1.5, 1.5]), jnp.array([1.0, -2.0, 1.0, -1.0])
    np.testing.assert_allclose(clipped_surrogate_loss(ratio, adv, 0.2), [-0.5, 2.0, -1.2, 1.5])
    values, old, returns = (
        jnp.array([1.0, 1.0, 0.0]),
        jnp.array([0.5, 1.1, 0.0]),
        jnp.array([0.0, 2.0, 1.0]),
    )
    # Entry 0: the clipped value 0.7 is closer to the return, so the unclipped error counts.
    np.testing.assert_allclose(
        ppo_value_loss(values, old, returns, 0.2), [0.5, 0.5 * 1.0**2, 0.5], rtol=1e-6
    )
    grad = jax.grad(lambda v: ppo_value_loss(v, old, jnp.array([5.0, 5.0, 5.0]), 0.2).sum())(values)
    np.testing.assert_array_equal(grad == 0.0, [True, False, False])


@given(
    rewards=floats, potentials=hnp.arrays(np.float32, T + 1, elements=st.floats(-5, 5, width=32))
)
def test_potential_shaping_only_shifts_the_return_by_the_first_potential(rewards, potentials):
    discounts = np.array([0.9] * (T - 1) + [0.0], np.float32)
    shaped = jax.jit(potential_shaping)(rewards, discounts, potentials[:-1], potentials[1:])
    base = _monte_carlo_returns(rewards, discounts, 0.0)[0]
    np.testing.assert_allclose(
        _monte_carlo_returns(shaped, discounts, 0.0)[0], base - potentials[0], atol=1e-3
    )


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"values must have shape \(7,\), got \(6,\)"):
        gae(jnp.zeros(T), jnp.zeros(T), jnp.ones(T), 0.9)
    with pytest.raises(ValueError, match=r"discount_t must have shape \(6,\), got \(5,\)"):
        lambda_returns(jnp.zeros(T), jnp.ones(T - 1), jnp.zeros(T))
    with pytest.raises(ValueError, match=r"lambda_ must have shape \(6,\)"):
        gae(jnp.zeros(T), jnp.zeros(T + 1), jnp.ones(T), jnp.ones(3))
    with pytest.raises(ValueError, match="r_t must be a floating-point array"):
        td_error(jnp.zeros(T), jnp.zeros(T, jnp.int32), jnp.ones(T), jnp.zeros(T))
