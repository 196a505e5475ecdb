"""The recompute-the-prefix decoder against a growing-prefix Python loop."""

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference import generate_recompute
from agentic_jax.models import TransformerConfig, forward, init_params

CFG = TransformerConfig(
    vocab_size=53, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24
)


def test_greedy_equals_argmax_over_growing_prefix():
    params = init_params(CFG, jax.random.key(0))
    prompt = jax.random.randint(jax.random.key(1), (2, 3), 0, CFG.vocab_size)
    got = generate_recompute(
        params, CFG, prompt, jax.random.key(2), max_new_tokens=4, temperature=0.0
    )
    seq = prompt
    for _ in range(4):
        nxt = jnp.argmax(forward(params, CFG, seq)[:, -1], axis=-1)
        seq = jnp.concatenate([seq, nxt[:, None].astype(seq.dtype)], axis=1)
    np.testing.assert_array_equal(got, seq)


def test_sampling_is_seeded_and_keeps_the_prompt():
    params = init_params(CFG, jax.random.key(0))
    prompt = jnp.array([[5, 6, 7]])
    a = generate_recompute(params, CFG, prompt, jax.random.key(3), max_new_tokens=6)
    b = generate_recompute(params, CFG, prompt, jax.random.key(3), max_new_tokens=6)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[:, :3], prompt)
    assert a.shape == (1, 9) and int(a.max()) < CFG.vocab_size
