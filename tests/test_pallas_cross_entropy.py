"""Chunked LM-head cross-entropy against optax on materialised logits."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels import cross_entropy_reference, fused_cross_entropy


def mean_loss(fn, hidden, w, labels, **kwargs):
    losses = fn(hidden, w, labels, **kwargs)
    return losses.sum() / jnp.maximum((labels != -100).sum(), 1), losses


@settings(max_examples=6)
@given(
    b=st.integers(1, 2),
    t=st.integers(1, 6),
    d=st.sampled_from([8, 16]),
    vocab=st.integers(5, 70),
    chunk=st.integers(4, 32),
    ignored=st.floats(0.0, 1.0),
    dtype=st.sampled_from([jnp.float32, jnp.bfloat16]),
    seed=st.integers(0, 2**16),
)
def test_values_and_gradients_match_optax(b, t, d, vocab, chunk, ignored, dtype, seed):
    rng = np.random.default_rng(seed)
    hidden = jnp.asarray(rng.standard_normal((b, t, d)), dtype)
    w = jnp.asarray(rng.standard_normal((d, vocab)) / np.sqrt(d), dtype)
    labels = rng.integers(0, vocab, (b, t))
    labels = jnp.asarray(np.where(rng.random((b, t)) < ignored, -100, labels), jnp.int32)

    def value_and_grads(fn, **kwargs):
        run = jax.value_and_grad(
            functools.partial(mean_loss, fn, **kwargs), argnums=(0, 1), has_aux=True
        )
        return jax.jit(run)(hidden, w, labels)

    (loss, losses), grads = value_and_grads(fused_cross_entropy, vocab_chunk=chunk)
    (want_loss, want_losses), want_grads = value_and_grads(cross_entropy_reference)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    assert losses.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(losses)[np.asarray(labels) == -100], 0.0)
    np.testing.assert_allclose(losses, want_losses, atol=tol, rtol=tol)
    np.testing.assert_allclose(loss, want_loss, atol=tol, rtol=tol)
    for got, want, x in zip(grads, want_grads, (hidden, w)):
        assert got.dtype == x.dtype
        np.testing.assert_allclose(
            np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol
        )


def test_logits_are_never_materialised():
    """Compiled temporaries of loss+grad stay far below one [B*T, V] f32 logits array."""
    hidden = jax.ShapeDtypeStruct((4, 64, 32), jnp.float32)
    w = jax.ShapeDtypeStruct((32, 16384), jnp.float32)
    labels = jax.ShapeDtypeStruct((4, 64), jnp.int32)
    logits_bytes = 4 * 64 * 16384 * 4

    def temp_bytes(fn, **kwargs):
        grad = jax.grad(lambda h, w, l: fn(h, w, l, **kwargs).sum(), argnums=(0, 1))
        return jax.jit(grad).lower(hidden, w, labels).compile().memory_analysis().temp_size_in_bytes

    assert temp_bytes(cross_entropy_reference) >= logits_bytes
    assert temp_bytes(fused_cross_entropy, vocab_chunk=512) < logits_bytes / 4


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="labels"):
        fused_cross_entropy(jnp.zeros((2, 3, 4)), jnp.zeros((4, 10)), jnp.zeros((2, 4), jnp.int32))
