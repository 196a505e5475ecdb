"""Distillation: KL directions, generalised JSD, temperature, top-k and self-distillation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import (
    DIVERGENCES,
    distillation_loss,
    self_distillation_loss,
    topk_distillation_loss,
)

B, T, V = 2, 3, 5
MASK = jnp.array([[1, 1, 1], [1, 0, 1]])
logits = hnp.arrays(np.float32, (B, T, V), elements=st.floats(-8.0, 8.0, width=32))


def _all_divergences(student, teacher, mask, temperature):
    return {
        d: distillation_loss(student, teacher, mask, divergence=d, temperature=temperature)
        for d in DIVERGENCES
    }


ALL = {
    "eager": _all_divergences,
    "jit": jax.jit(_all_divergences, static_argnames=("temperature",)),
}


def _log_softmax(x):
    x = np.float64(x)
    return (
        x
        - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))
        - x.max(-1, keepdims=True)
    )


def _reference(student, teacher, temperature):
    s, t = _log_softmax(student / temperature), _log_softmax(teacher / temperature)
    kl = lambda p, q: (np.exp(p) * (p - q)).sum(-1)  # noqa: E731
    m = np.log(0.5 * np.exp(s) + 0.5 * np.exp(t))
    per_token = {
        "forward_kl": kl(t, s),
        "reverse_kl": kl(s, t),
        "jsd": 0.5 * kl(t, m) + 0.5 * kl(s, m),
    }
    mask = np.asarray(MASK, bool)
    return {d: temperature**2 * v[mask].mean() for d, v in per_token.items()}


@pytest.mark.parametrize("variant", sorted(ALL))
@given(student=logits, teacher=logits, temperature=st.sampled_from([1.0, 2.0]))
def test_divergences_match_a_float64_reference(variant, student, teacher, temperature):
    outputs = ALL[variant](student, teacher, MASK, temperature)
    for divergence, expected in _reference(student, teacher, temperature).items():
        np.testing.assert_allclose(
            outputs[divergence].value, expected, rtol=1e-4, atol=1e-5, err_msg=divergence
        )


@given(student=logits, teacher=logits)
def test_divergences_are_nonnegative_zero_at_equality_and_jsd_is_symmetric_and_bounded(
    student, teacher
):
    outputs, same = ALL["jit"](student, teacher, MASK, 1.0), ALL["jit"](student, student, MASK, 1.0)
    swapped = ALL["jit"](teacher, student, MASK, 1.0)
    for divergence in DIVERGENCES:
        assert outputs[divergence].value >= -1e-6 and abs(same[divergence].value) < 1e-5, divergence
    np.testing.assert_allclose(outputs["jsd"].value, swapped["jsd"].value, rtol=1e-4, atol=1e-6)
    assert outputs["jsd"].value <= math.log(2.0) + 1e-6


def test_teacher_receives_no_gradient_and_extreme_logits_stay_finite():
    student = jnp.array(np.random.default_rng(0).normal(size=(B, T, V)) * 1e4, jnp.float32)
    teacher = -student

    def total(s, t):
        return sum(o.value for o in _all_divergences(s, t, MASK, 1.0).values())

    value, (grad_s, grad_t) = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))(student, teacher)
    assert np.isfinite(value) and np.all(np.isfinite(grad_s))
    np.testing.assert_array_equal(grad_t, 0.0)
    empty = _all_divergences(student, teacher, jnp.zeros_like(MASK), 1.0)
    assert all(o.value == 0.0 for o in empty.values())


def test_vocabulary_masked_in_both_models_is_left_out_of_value_and_gradient():
    rng = np.random.default_rng(3)
    student, teacher = (jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32) for _ in range(2))
    # A padded vocabulary: two extra entries at −inf in both models.
    pad = jnp.full((B, T, 2), -jnp.inf)
    padded_student, padded_teacher = (
        jnp.concatenate([student, pad], -1),
        jnp.concatenate([teacher, pad], -1),
    )

    def total(s, t):
        return jnp.stack([o.value for o in _all_divergences(s, t, MASK, 1.0).values()])

    np.testing.assert_allclose(
        total(padded_student, padded_teacher), total(student, teacher), rtol=1e-6
    )
    grads = jax.jacrev(total)(padded_student, padded_teacher)
    np.testing.assert_allclose(
        grads[..., :V], jax.jacrev(total)(student, teacher), rtol=1e-5, atol=1e-7
    )
    np.testing.assert_array_equal(grads[..., V:], 0.0)


def test_topk_with_the_whole_vocabulary_is_forward_kl_and_nonnegative_otherwise():
    rng = np.random.default_rng(1)
    student, teacher = (jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32) for _ in range(2))
    ids = jnp.broadcast_to(jnp.arange(V), (B, T, V))
    full = topk_distillation_loss(student, teacher, ids, MASK, temperature=2.0)
    np.testing.assert_allclose(
        full.value, distillation_loss(student, teacher, MASK, temperature=2.0).value, rtol=1e-5
    )
    top_logits, top_ids = jax.lax.top_k(teacher, 2)
    partial = jax.jit(topk_distillation_loss)(student, top_logits, top_ids, MASK)
    assert partial.value >= 0.0 and np.isfinite(partial.value)
    with pytest.raises(ValueError, match="teacher_topk_ids must be an integer array"):
        topk_distillation_loss(student, top_logits, jnp.float32(top_ids), MASK)


def test_self_distillation_detaches_the_privileged_branch():
    rng = np.random.default_rng(2)
    plain, privileged = (jnp.asarray(rng.normal(size=(B, T, V)), jnp.float32) for _ in range(2))
    out = self_distillation_loss(plain, privileged, MASK)
    reverse = distillation_loss(plain, privileged, MASK, divergence="reverse_kl")
    np.testing.assert_allclose(out.value, reverse.value, rtol=1e-6)
    grad_plain, grad_privileged = jax.grad(
        lambda a, b: self_distillation_loss(a, b, MASK).value, argnums=(0, 1)
    )(plain, privileged)
    assert np.any(grad_plain != 0.0)
    np.testing.assert_array_equal(grad_privileged, 0.0)


def test_errors_name_the_argument_and_the_valid_values():
    x = jnp.zeros((B, T, V))
    with pytest.raises(
        ValueError, match=r"unknown divergence 'tv'; valid values: forward_kl, reverse_kl, jsd"
    ):
        distillation_loss(x, x, MASK, divergence="tv")
    with pytest.raises(ValueError, match=r"teacher_logits must have shape \(2, 3, 5\)"):
        distillation_loss(x, x[..., :4], MASK)
    with pytest.raises(ValueError, match="jsd_beta"):
        distillation_loss(x, x, MASK, divergence="jsd", jsd_beta=1.0)
