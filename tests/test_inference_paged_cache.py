"""Decoding through a paged KV cache reproduces the full forward pass at every position."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.inference.serving.paged_cache import (
    PagedBatch,
    PagedKVCache,
    copy_blocks,
    decode_attention_fn,
    paged_forward,
)
from agentic_jax.models import TransformerConfig, forward, param_shapes

# A window shorter than the sequences, so the windowed masks of both attention paths count.
CFG = TransformerConfig(
    vocab_size=61,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    init_std=0.2,
    sliding_window=7,
)
BLOCK, NUM_BLOCKS, MAX_BLOCKS = 4, 16, 6


def random_params(config, seed=0):
    """Gaussian parameters from numpy: compiling ``init_params`` costs seconds on a busy CPU."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, 0.3, s.shape), s.dtype), param_shapes(config)
    )


def _batch(tables, starts, ends, width):
    """Rows left-padded to ``width`` tokens covering positions [start, end) of each sequence."""
    b = len(starts)
    positions = np.zeros((b, width), np.int32)
    slots = np.full((b, width), NUM_BLOCKS * BLOCK, np.int32)
    for i, (s, e) in enumerate(zip(starts, ends)):
        pos = np.arange(s, e)
        positions[i, width - (e - s) :] = pos
        slots[i, width - (e - s) :] = tables[i][pos // BLOCK] * BLOCK + pos % BLOCK
    return PagedBatch(positions, slots, tables, np.asarray(ends, np.int32))


def _tokens(seqs, starts, ends, width):
    out = np.zeros((len(seqs), width), np.int32)
    for i, (s, e) in enumerate(zip(starts, ends)):
        out[i, width - (e - s) :] = seqs[i][s:e]
    return out


@pytest.mark.parametrize("decode", ["reference", "pallas"])  # the kernel runs interpreted on CPU
def test_prefill_chunks_then_decode_equal_the_forward_pass(decode):
    config = CFG
    params = random_params(config)
    rng = np.random.default_rng(1)
    lengths = (19, 13)
    seqs = [rng.integers(0, config.vocab_size, n) for n in lengths]
    tables = rng.permutation(NUM_BLOCKS)[: 2 * MAX_BLOCKS].reshape(2, MAX_BLOCKS).astype(np.int32)
    want = [
        np.asarray(jax.jit(forward, static_argnums=1)(params, config, jnp.asarray(s)[None])[0])
        for s in seqs
    ]
    step = jax.jit(
        functools.partial(
            paged_forward, config=config, decode_attention=decode_attention_fn(decode)
        )
    )
    cache = PagedKVCache.create(config, NUM_BLOCKS, BLOCK)

    # Two prefill chunks of different lengths per row (the second sees the first through the
    # pages, as a prompt with a cached prefix does), then one token at a time.
    bounds = [(0, 0), (5, 3), (9, 9)]
    for (s0, s1), (e0, e1) in itertools.pairwise(bounds):
        batch = _batch(tables, (s0, s1), (e0, e1), 8)
        logits, cache = step(
            params, cache=cache, tokens=_tokens(seqs, (s0, s1), (e0, e1), 8), batch=batch
        )
        np.testing.assert_allclose(logits[0], want[0][e0 - 1], atol=2e-5)
        np.testing.assert_allclose(logits[1], want[1][e1 - 1], atol=2e-5)
    for p in range(9, max(lengths)):
        # Row 1 ends first; it then idles with length 0 and must not disturb row 0.
        live = [p < n for n in lengths]
        ends = [p + 1 if a else 0 for a in live]
        starts = [p if a else 0 for a in live]
        batch = _batch(tables, starts, ends, 1)
        tokens = _tokens(seqs, starts, ends, 1)
        logits, cache = step(params, cache=cache, tokens=tokens, batch=batch)
        for i in range(2):
            if live[i]:
                np.testing.assert_allclose(logits[i], want[i][p], atol=2e-5)


def test_copy_blocks_copies_every_layer_and_skips_out_of_range_pairs():
    pages = jnp.arange(2 * 5 * 2 * 1 * 2, dtype=jnp.float32).reshape(2, 5, 2, 1, 2)
    cache = PagedKVCache(pages, pages + 1000)
    got = copy_blocks(cache, jnp.array([1, 2]), jnp.array([3, 5]))
    for before, after in zip(cache, got):
        np.testing.assert_array_equal(after[:, 3], before[:, 1])
        np.testing.assert_array_equal(np.delete(after, 3, axis=1), np.delete(before, 3, axis=1))


def test_unknown_decode_attention_is_rejected():
    assert decode_attention_fn("reference").__name__ == "paged_attention_reference"
    with pytest.raises(ValueError, match="decode attention"):
        decode_attention_fn("flash")
