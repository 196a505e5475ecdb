"""Reward-model losses: Bradley–Terry, Plackett–Luce / ListMLE and process-reward BCE."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax.rl import bradley_terry_loss, plackett_luce_loss, process_reward_loss

B, K = 3, 4
rewards = hnp.arrays(np.float32, B, elements=st.floats(-20.0, 20.0, width=32))
JIT_BT = jax.jit(bradley_terry_loss, static_argnames=("center_coef",))
JIT_PL = jax.jit(plackett_luce_loss)


@pytest.mark.parametrize("fn", [bradley_terry_loss, JIT_BT], ids=["eager", "jit"])
@given(chosen=rewards, rejected=rewards, margin=rewards, shift=st.floats(-5.0, 5.0, width=32))
def test_bradley_terry_matches_its_formula_and_is_shift_invariant(
    fn, chosen, rejected, margin, shift
):
    x = np.float64(chosen) - np.float64(rejected) - np.float64(margin)
    np.testing.assert_allclose(
        fn(chosen, rejected, margin=margin), np.logaddexp(0.0, -x), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        fn(chosen + shift, rejected + shift), fn(chosen, rejected), rtol=1e-5, atol=1e-5
    )
    centered = fn(chosen, rejected, center_coef=0.01)
    np.testing.assert_allclose(
        centered - fn(chosen, rejected),
        0.01 * (np.float64(chosen) + rejected) ** 2,
        rtol=1e-3,
        atol=1e-3,
    )


def test_bradley_terry_gradient_separates_the_pair():
    grad_c, grad_r = jax.grad(lambda c, r: bradley_terry_loss(c, r).sum(), argnums=(0, 1))(
        jnp.zeros(2), jnp.zeros(2)
    )
    np.testing.assert_allclose(grad_c, -0.5)
    np.testing.assert_allclose(grad_r, 0.5)


def _slow_list_mle(scores, mask):
    total = []
    for row, valid in zip(np.float64(scores), mask, strict=True):
        items = row[valid]
        total.append(-sum(items[k] - np.log(np.exp(items[k:]).sum()) for k in range(len(items))))
    return np.array(total)


@given(
    scores=hnp.arrays(np.float32, (B, K), elements=st.floats(-10.0, 10.0, width=32)),
    mask=hnp.arrays(np.bool_, (B, K)),
)
def test_plackett_luce_matches_a_slow_loop_with_missing_items(scores, mask):
    np.testing.assert_allclose(
        JIT_PL(scores, mask), _slow_list_mle(scores, mask), rtol=1e-4, atol=1e-4
    )


def test_plackett_luce_with_two_items_is_bradley_terry():
    scores = jnp.array([[1.0, -2.0], [0.0, 3.0], [-1e4, 1e4]])
    np.testing.assert_allclose(JIT_PL(scores), JIT_BT(scores[:, 0], scores[:, 1]), rtol=1e-6)
    assert np.all(np.isfinite(jax.jit(jax.grad(lambda s: plackett_luce_loss(s).sum()))(scores)))
    assert plackett_luce_loss(jnp.zeros((1, 3))) == pytest.approx(
        math.log(6.0)
    )  # uniform over 3! orders


@pytest.mark.parametrize("jit", [False, True])
def test_process_reward_loss_is_masked_bce(jit):
    fn = jax.jit(process_reward_loss) if jit else process_reward_loss
    logits = jnp.array([[2.0, -1.0, 0.5], [-3.0, 1e4, -1e4]])
    labels = jnp.array([[1.0, 0.0, 0.3], [0.0, 1.0, 1.0]])
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    out = fn(logits, labels, mask)
    x, y, m = np.float64(logits), np.float64(labels), np.asarray(mask, bool)
    bce = np.logaddexp(0.0, x) - y * x
    np.testing.assert_allclose(out.value, bce[m].mean(), rtol=1e-5)
    assert out.metric_means()["accuracy"] == pytest.approx(4 / 5)
    empty = fn(logits, labels, jnp.zeros_like(mask))
    assert empty.value == 0.0
    with pytest.raises(ValueError, match=r"step_labels must have shape \(2, 3\)"):
        process_reward_loss(logits, labels[:, :2], mask)
