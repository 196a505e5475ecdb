"""A model with ``attention_impl="ring"`` on a data x sequence mesh gives the single-device logits
and gradients, with grouped-query or multi-head latent attention: the zig-zag reordering, RoPE
positions and segment masks survive the ring."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tiny_models import packed_batch, tiny_mla

from agentic_jax.models import TransformerConfig, forward, init_params
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.qk_clip import hidden_states_with_max_logits
from sharding import DEFAULT_RULES, activate, make_mesh

# T = 16 splits into 2 x 4 zig-zag chunks of 2 positions on sequence=4; B = 4 rows on data=2.
CFG = TransformerConfig(
    vocab_size=128,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=64,
    max_seq_len=16,
    tie_embeddings=False,
    attention_impl="xla",
    dtype="float32",
    param_dtype="float32",
)
MLA = tiny_mla(CFG)
B, T = 4, 16


def logits_and_grads(config, params, batch):
    def loss(params):
        logits = forward(
            params,
            config,
            batch["tokens"],
            positions=batch["positions"],
            segment_ids=batch["segment_ids"],
        )
        total, _, _ = cross_entropy(logits, batch["targets"], jnp.ones((B, T)))
        return total, logits

    return jax.grad(loss, has_aux=True)(params)[::-1]


@pytest.mark.parametrize("config", [CFG, MLA], ids=["gqa", "mla"])
def test_ring_model_equals_single_device_logits_and_grads(config):
    params = init_params(config, jax.random.key(0))
    batch = packed_batch(np.random.default_rng(0), B, T, config.vocab_size)
    want_logits, want_grads = jax.jit(logits_and_grads, static_argnums=0)(config, params, batch)

    ring_cfg = config.replace(attention_impl="ring")
    with activate(make_mesh({"data": 2, "sequence": 4}), DEFAULT_RULES):
        step = jax.jit(logits_and_grads, static_argnums=0)
        hlo = step.lower(ring_cfg, params, batch).compile().as_text()
        got_logits, got_grads = step(ring_cfg, params, batch)

    assert "collective-permute" in hlo  # K/V blocks went round the ring
    np.testing.assert_allclose(got_logits, want_logits, atol=2e-5, rtol=2e-5)
    jax.tree.map(
        lambda g, w: np.testing.assert_allclose(g, w, atol=2e-5, rtol=2e-4), got_grads, want_grads
    )


def test_ring_without_a_mesh_is_plain_attention():
    params = init_params(CFG, jax.random.key(1))
    tokens = jnp.asarray(packed_batch(np.random.default_rng(1), B, T, CFG.vocab_size)["tokens"])
    np.testing.assert_allclose(
        forward(params, CFG.replace(attention_impl="ring"), tokens),
        forward(params, CFG, tokens),
        atol=1e-6,
    )


@pytest.mark.parametrize("config", [CFG, MLA], ids=["gqa", "mla"])
def test_qk_clip_logits_under_the_ring_mesh_equal_one_devices(config):
    """QK-Clip's per-head maxima come from a recording ``attend`` hook, which the ring leaves
    to the partitioner: on the data x sequence mesh they are the one-device maxima."""
    params = init_params(config, jax.random.key(2))
    batch = packed_batch(np.random.default_rng(2), B, T, config.vocab_size)

    def max_logits(config):
        return hidden_states_with_max_logits(
            params, config, batch["tokens"], positions=batch["positions"],
            segment_ids=batch["segment_ids"],
        )[1]  # fmt: skip

    want = jax.jit(max_logits, static_argnums=0)(config)
    with activate(make_mesh({"data": 2, "sequence": 4}), DEFAULT_RULES):
        got = jax.jit(max_logits, static_argnums=0)(config.replace(attention_impl="ring"))
    np.testing.assert_allclose(got, want, rtol=1e-5)
