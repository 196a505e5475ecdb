"""A tiny transformer evaluates and trains identically through the Pallas kernel and XLA."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentic_jax.models import TransformerConfig, forward, init_params
from agentic_jax.models.transformer import hidden_states, lm_head_weight
from pallas_kernels import fused_cross_entropy
from pallas_kernels.backend import INTERPRET_COMPILER_OPTIONS

CFG = TransformerConfig(
    vocab_size=61,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    max_seq_len=64,
    sliding_window=6,
)
TOKENS = jax.random.randint(jax.random.key(1), (2, 21), 0, CFG.vocab_size)
SEGMENTS = jnp.asarray([[1] * 13 + [2] * 7, [1] * 20])  # one packed row, one plain row


@functools.partial(jax.jit, static_argnums=1, compiler_options=INTERPRET_COMPILER_OPTIONS)
def _loss_grads_logits(params, config):
    def loss(params):
        logits = forward(params, config, TOKENS[:, :-1], segment_ids=SEGMENTS)
        return optax.softmax_cross_entropy_with_integer_labels(logits, TOKENS[:, 1:]).mean(), logits

    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, grads, logits


def test_pallas_logits_and_gradients_equal_xla():
    params = init_params(CFG, jax.random.key(0))
    loss_x, grads_x, logits_x = _loss_grads_logits(params, CFG.replace(attention_impl="xla"))
    loss_p, grads_p, logits_p = _loss_grads_logits(params, CFG.replace(attention_impl="pallas"))
    np.testing.assert_allclose(logits_p, logits_x, atol=1e-5)
    np.testing.assert_allclose(loss_p, loss_x, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(grads_p), jax.tree.leaves(grads_x)):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_fused_cross_entropy_on_model_hidden_states_equals_logits_loss():
    params = init_params(CFG, jax.random.key(0))
    tokens, labels = TOKENS[:, :-1], TOKENS[:, 1:]

    @jax.jit
    def losses(params):
        h = hidden_states(params, CFG, tokens)
        fused = fused_cross_entropy(h, lm_head_weight(params, CFG), labels, vocab_chunk=16)
        logits = forward(params, CFG, tokens)
        return fused, optax.softmax_cross_entropy_with_integer_labels(logits, labels)

    fused, want = losses(params)
    np.testing.assert_allclose(fused, want, atol=1e-5)
