"""Attention sinks with a StreamingLLM cache: decoding against a full forward pass whose mask is
written out over the whole sequence (sinks + window), the ring's bookkeeping against a simulated
ring, prefill against token-by-token feeding, and the limits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_oracle import prompts, random_params
from test_models_attention_variants import BASE as VARIANTS_BASE
from test_models_mla import MLA

from agentic_jax.inference.decoding.generate import generate
from agentic_jax.inference.decoding.kv_cache import init_cache, masked_attention
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.decoding.streaming import (
    StreamingCache,
    streaming_extend_logits,
    streaming_prefill,
)
from agentic_jax.models.transformer import hidden_states, logits_from_hidden

# The attention-variant and MLA tests' tiny models, with a context shorter than the generations.
BASE = VARIANTS_BASE.replace(max_seq_len=16)
CONFIGS = {
    # A windowed layer and a global one: the cache policy must compose with the model's mask.
    "gqa": BASE.replace(sliding_window=3, sliding_window_pattern=2),
    "mla": MLA.replace(max_seq_len=16),
}
POLICY = StreamingCache(sink_tokens=2, window=4)


def masked_forward_logits(params, config, tokens, policy):
    """Logits of ``tokens[T]`` with every position's attention masked to what a StreamingLLM
    decoder keeps: key ``k`` visible to query ``q`` iff ``k <= q``, ``k < S or q - k < W``, and
    ``q - k < w`` in a layer windowed by ``w``.  The whole sequence in one pass, no cache."""
    pos = jnp.arange(len(tokens))
    q, k = pos[:, None], pos[None, :]
    seen = (k <= q) & ((k < policy.sink_tokens) | (q - k < policy.window))

    def attend(q_, k_, v_, state, window):
        mask = seen if window is None else seen & (q - k < window)
        return masked_attention(q_, k_, v_, mask[None], config.attn_logit_softcap), state

    h, _ = hidden_states(params, config, jnp.asarray([tokens]), attend=attend)
    return logits_from_hidden(params, config, h)[0]


def greedy(params, config, rows, max_tokens, streaming):
    """Greedy ``generate`` with every step's logits."""
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    key = jax.random.key(0)
    return generate(
        params, config, rows, sampling=sampling, key=key, return_logits=True, streaming=streaming
    )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_streaming_decoding_equals_masked_forward(name):
    """Left-padded prompts longer than the cache (6 slots), then twice the cache in new tokens:
    every step's logits are the explicitly masked forward pass's."""
    config = CONFIGS[name]
    params = random_params(config)
    rows = prompts(config, (9, 4))
    out = greedy(params, config, rows, 12, POLICY)
    for b, prompt in enumerate(rows):
        tokens = prompt + np.asarray(out.tokens[b]).tolist()
        want = masked_forward_logits(params, config, tokens, POLICY)
        want = want[len(prompt) - 1 : len(tokens) - 1]
        np.testing.assert_allclose(out.logits[b], want, atol=2e-4, rtol=1e-4)


def test_slot_positions_follow_a_simulated_ring():
    """The closed-form slot contents equal writing positions 0, 1, ... into slot(p) one by one."""
    policy = StreamingCache(sink_tokens=3, window=5)
    lengths = np.arange(1, 30)
    slots = np.asarray(policy.slot(jnp.asarray(lengths - 1)))
    held, want = np.full(policy.slots, -1), []
    for n, slot in zip(lengths, slots):
        held[slot] = n - 1
        want.append(held.copy())
    np.testing.assert_array_equal(policy.slot_positions(jnp.asarray(lengths)), want)
    no_sinks = StreamingCache(sink_tokens=0, window=4)
    np.testing.assert_array_equal(no_sinks.slot_positions(jnp.asarray([10]))[0], [8, 9, 6, 7])


def test_prefill_equals_token_by_token():
    """Prompts longer than the window, one left- and one right-padded, leave the cache exactly
    as feeding them token by token, with the same last hidden state."""
    config = BASE
    params = random_params(config)
    rows = prompts(config, (11, 11))
    tokens = jnp.asarray([[0, 0, *rows[0]], [*rows[1], 0, 0]])
    start, end = jnp.asarray([2, 0]), jnp.asarray([13, 11])
    empty = init_cache(config, 2, POLICY.slots)
    prefill = jax.jit(streaming_prefill, static_argnames=("config", "policy"))
    step = jax.jit(streaming_extend_logits, static_argnames=("config", "policy"))
    h, cache = prefill(params, config, empty, tokens, start, end, policy=POLICY)

    columns = jnp.asarray(rows).T[:, :, None]  # [11, B, 1]: one token per row per step
    zero = jnp.zeros((2,), jnp.int32)
    _, stepped = prefill(params, config, empty, columns[0], zero, zero + 1, policy=POLICY)
    for i in range(1, len(columns)):
        _, last, stepped = step(params, config, stepped, columns[i], zero, zero + i, policy=POLICY)
    for got, want in zip(cache, stepped):
        np.testing.assert_allclose(got, want, atol=1e-5)
    np.testing.assert_allclose(h[jnp.arange(2), end - 1], last[:, 0], atol=1e-5)


def test_large_cache_equals_plain_decoding():
    """With sink_tokens + window covering prompt and generation nothing is evicted: the tokens
    and logits of plain ``generate``."""
    config = BASE
    params = random_params(config)
    rows = prompts(config, (5, 3))
    plain, streamed = (
        greedy(params, config, rows, 6, streaming)
        for streaming in (None, StreamingCache(sink_tokens=1, window=10))
    )
    np.testing.assert_array_equal(plain.tokens, streamed.tokens)
    np.testing.assert_allclose(plain.logits, streamed.logits, atol=1e-5)


def test_generation_past_cache_and_context_stays_finite():
    """Sampling 40 tokens through a 6-slot cache, past the model's max_seq_len = 16 (RoPE keeps
    absolute positions; nothing enforces max_seq_len in generate)."""
    config = BASE
    params = random_params(config)
    sampling = SamplingParams(temperature=1.0, max_tokens=40)
    out = generate(
        params,
        config,
        prompts(config, (5, 8)),
        sampling=sampling,
        key=jax.random.key(1),
        streaming=POLICY,
        fork=[0, 1, 1],
    )
    assert np.asarray(out.lengths).tolist() == [40, 40, 40]
    assert np.isfinite(np.asarray(out.raw_logprobs)).all()
    assert np.isfinite(np.asarray(out.sample_logprobs)).all()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sink_tokens=-1, window=4), "sink_tokens must be an int >= 0"),
        (dict(sink_tokens=2, window=0), "window must be an int >= 1"),
        (dict(sink_tokens=2, window=None), "window must be an int >= 1"),
        (dict(sink_tokens=2.0, window=4), "sink_tokens must be an int"),
        (dict(sink_tokens=True, window=4), "sink_tokens must be an int"),
    ],
)
def test_invalid_policy(kwargs, match):
    with pytest.raises(ValueError, match=match):
        StreamingCache(**kwargs)


def test_invalid_arguments():
    params = random_params(BASE)
    with pytest.raises(TypeError, match="streaming must be a StreamingCache"):
        generate(
            params,
            BASE,
            [[1, 2]],
            sampling=SamplingParams(max_tokens=2),
            key=jax.random.key(0),
            streaming=(2, 4),
        )
    wrong = init_cache(BASE, 1, POLICY.slots + 1)
    one = jnp.ones((1,), jnp.int32)
    with pytest.raises(ValueError, match="needs a cache of that many slots"):
        streaming_prefill(params, BASE, wrong, jnp.asarray([[1]]), one * 0, one, policy=POLICY)
