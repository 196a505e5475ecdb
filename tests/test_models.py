"""Transformer core: masks, RoPE, GQA, packing, layer scan and precision."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from agentic_jax.models import (
    TransformerConfig,
    attention,
    flops_per_token,
    forward,
    init_params,
    param_axes,
    param_count,
    segment_positions,
)
from agentic_jax.models.rope import apply_rope, rope_tables

CFG = TransformerConfig(
    vocab_size=97,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    max_seq_len=64,
)


@pytest.fixture(scope="module")
def params():
    return init_params(CFG, jax.random.key(0))


_forward = jax.jit(forward, static_argnums=1)


def _tokens(seed, b=2, t=12, v=CFG.vocab_size):
    return jax.random.randint(jax.random.key(seed), (b, t), 0, v)


@given(st.integers(0, 10))
def test_causal_prefix_logits_ignore_future_tokens(params, i):
    tokens = _tokens(1)
    changed = tokens.at[:, i + 1 :].set((tokens[:, i + 1 :] + 7) % CFG.vocab_size)
    a, b = _forward(params, CFG, tokens), _forward(params, CFG, changed)
    np.testing.assert_allclose(a[:, : i + 1], b[:, : i + 1], atol=1e-5)
    assert not np.allclose(a[:, i + 1 :], b[:, i + 1 :], atol=1e-3)


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"type": "linear", "factor": 2.0},
        {"type": "ntk", "factor": 4.0},
        {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
        {"type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16},
    ],
)
@given(m=st.integers(0, 40), n=st.integers(0, 40), shift=st.integers(0, 200))
def test_rope_scores_depend_only_on_relative_position(scaling, m, n, shift):
    cfg = CFG.replace(rope_scaling=scaling)
    q, k = jax.random.normal(jax.random.key(3), (2, 1, 1, 1, cfg.head_dim))

    def score(pm, pn):
        pos = jnp.array([[pm, pn]])
        cos, sin = rope_tables(cfg, pos)
        qr = apply_rope(q, cos[:, :1], sin[:, :1])
        kr = apply_rope(k, cos[:, 1:], sin[:, 1:])
        return jnp.sum(qr * kr)

    np.testing.assert_allclose(score(m, n), score(m + shift, n + shift), rtol=1e-4, atol=1e-4)


def _qkv(seed, b=2, t=16, s=16, n=4, k=2, h=8, dtype=jnp.float32):
    ks = jax.random.split(jax.random.key(seed), 3)
    return (
        jax.random.normal(ks[0], (b, t, n, h), dtype),
        jax.random.normal(ks[1], (b, s, k, h), dtype),
        jax.random.normal(ks[2], (b, s, k, h), dtype),
    )


def _naive_mha(q, k, v, causal):
    """Per-head numpy attention, K == N."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, t, n, h = q.shape
    s = k.shape[1]
    out = np.zeros_like(q)
    for bi in range(b):
        for ni in range(n):
            logits = q[bi, :, ni] @ k[bi, :, ni].T / np.sqrt(h)
            if causal:
                logits = np.where(
                    np.arange(s)[None] <= np.arange(t)[:, None] + s - t, logits, -np.inf
                )
            p = np.exp(logits - logits.max(-1, keepdims=True))
            out[bi, :, ni] = (p / p.sum(-1, keepdims=True)) @ v[bi, :, ni]
    return out


@pytest.mark.parametrize("impl", ["xla", "xla_chunked"])
def test_gqa_with_k_equal_n_is_mha(impl):
    q, k, v = _qkv(0, n=4, k=4)
    out = attention(q, k, v, causal=True, implementation=impl, chunk_size=8)
    np.testing.assert_allclose(out, _naive_mha(q, k, v, True), atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "xla_chunked"])
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_gqa_equals_mha_with_repeated_kv(impl, kv_heads):
    q, k, v = _qkv(1, n=4, k=kv_heads)
    rep = 4 // kv_heads
    got = attention(q, k, v, implementation=impl, chunk_size=8)
    want = attention(
        q, jnp.repeat(k, rep, axis=2), jnp.repeat(v, rep, axis=2), implementation=impl, chunk_size=8
    )
    np.testing.assert_allclose(got, want, atol=1e-5)


MASKS = {
    "causal": dict(causal=True),
    "full": dict(causal=False),
    "window": dict(causal=True, sliding_window=5),
    "window_bidirectional": dict(causal=False, sliding_window=3),
    "segments": dict(causal=True, segments=True),
    "softcap": dict(causal=True, logits_soft_cap=2.0, sm_scale=0.7),
}


@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("t,s,chunk", [(16, 16, 4), (13, 13, 5), (6, 20, 8)])
def test_chunked_equals_reference_value_and_grad(mask, t, s, chunk):
    kw = dict(MASKS[mask])
    q, k, v = _qkv(2, t=t, s=s)
    if kw.pop("segments", False):
        k_seg = jnp.array([[1] * (s // 2) + [2] * (s - s // 2), [1] * s])
        kw["segment_ids"] = (k_seg[:, s - t :], k_seg)
    w = jax.random.normal(jax.random.key(9), q.shape)

    def loss(impl, q, k, v):
        return jnp.sum(attention(q, k, v, implementation=impl, chunk_size=chunk, **kw) * w)

    ref_val, ref_grad = jax.jit(jax.value_and_grad(lambda *a: loss("xla", *a), argnums=(0, 1, 2)))(
        q, k, v
    )
    val, grad = jax.jit(jax.value_and_grad(lambda *a: loss("xla_chunked", *a), argnums=(0, 1, 2)))(
        q, k, v
    )
    np.testing.assert_allclose(val, ref_val, rtol=1e-5, atol=1e-4)
    for g, r in zip(grad, ref_grad):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-4)


@settings(max_examples=10, deadline=None)
@given(seg_id=st.integers(-(2**31), 2**31 - 1), s=st.sampled_from([5, 7]), causal=st.booleans())
@example(seg_id=-1, s=5, causal=False)
def test_chunked_padding_keys_stay_hidden_for_any_segment_id(seg_id, s, causal):
    """Keys padded up to a whole chunk are invisible whatever id the real tokens carry (-1 too)."""
    q, k, v = _qkv(6, t=s, s=s)
    seg = (jnp.full((2, s), seg_id, jnp.int32), jnp.full((2, s), seg_id, jnp.int32))
    got = attention(
        q, k, v, causal=causal, segment_ids=seg, implementation="xla_chunked", chunk_size=4
    )
    want = attention(q, k, v, causal=causal, segment_ids=seg, implementation="xla")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "xla_chunked"])
def test_fully_masked_rows_are_zero_with_finite_grads(impl):
    q, k, v = _qkv(3, t=8, s=8)
    seg = (jnp.full((2, 8), 5), jnp.ones((2, 8), jnp.int32))  # no key shares a query's segment

    def f(q, k, v):
        return attention(q, k, v, segment_ids=seg, implementation=impl, chunk_size=4)

    np.testing.assert_array_equal(jax.jit(f)(q, k, v), 0.0)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(f(*a)), argnums=(0, 1, 2)))(q, k, v)
    assert all(np.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("impl", ["xla", "xla_chunked"])
def test_packed_batch_equals_separate_sequences(params, impl):
    cfg = CFG.replace(attention_impl=impl, attention_chunk_size=4)
    a, b = _tokens(4, b=1, t=7), _tokens(5, b=1, t=5)
    packed = jnp.concatenate([a, b], axis=1)
    seg = jnp.array([[1] * 7 + [2] * 5])
    got = _forward(params, cfg, packed, segment_ids=seg)
    np.testing.assert_allclose(got[:, :7], _forward(params, cfg, a), atol=1e-5)
    np.testing.assert_allclose(got[:, 7:], _forward(params, cfg, b), atol=1e-5)


def test_segment_positions_restart_per_segment():
    seg = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
    np.testing.assert_array_equal(segment_positions(seg), [[0, 1, 2, 0, 1, 0, 0, 1]])


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_scanned_layers_equal_unrolled(params, remat):
    tokens = _tokens(6)
    scanned = CFG.replace(remat_policy=remat)
    unrolled = scanned.replace(scan_layers=False)
    np.testing.assert_allclose(
        _forward(params, scanned, tokens), _forward(params, unrolled, tokens), atol=1e-5
    )
    g = [
        jax.jit(jax.grad(lambda p, c=c: jnp.sum(forward(p, c, tokens) ** 2)))(params)
        for c in (scanned, unrolled)
    ]
    for x, y in zip(jax.tree.leaves(g[0]), jax.tree.leaves(g[1])):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)


def test_bf16_compute_close_to_fp32(params):
    tokens = _tokens(7)
    full = _forward(params, CFG, tokens)
    half = _forward(params, CFG.replace(dtype="bfloat16"), tokens)
    assert half.dtype == jnp.float32
    # bf16 has an 8-bit mantissa: compare probabilities, not raw logits.
    np.testing.assert_allclose(jax.nn.softmax(half), jax.nn.softmax(full), atol=2e-2)
    assert float(jnp.mean(jnp.abs(half - full))) < 0.05


def test_sliding_window_limits_context(params):
    cfg = CFG.replace(sliding_window=3)
    tokens = _tokens(8, t=10)
    changed = tokens.at[:, 0].set((tokens[:, 0] + 1) % CFG.vocab_size)
    a, b = _forward(params, cfg, tokens), _forward(params, cfg, changed)
    # Two layers of a width-3 window reach back 2 * (3 - 1) = 4 positions.
    np.testing.assert_allclose(a[:, 5:], b[:, 5:], atol=1e-5)
    assert not np.allclose(a[:, 4], b[:, 4], atol=1e-4)


def test_param_axes_match_param_ranks(params):
    axes = param_axes(CFG.replace(qkv_bias=True, tie_embeddings=False))
    p = init_params(CFG.replace(qkv_bias=True, tie_embeddings=False), jax.random.key(1))
    pairs = jax.tree.map(
        lambda a, ax: (a.ndim, len(ax)),
        p,
        axes,
        is_leaf=lambda x: isinstance(x, tuple) and all(isinstance(s, str) for s in x),
    )
    for ndim, n_axes in jax.tree.leaves(pairs, is_leaf=lambda x: isinstance(x, tuple)):
        assert ndim == n_axes
    assert param_count(CFG) == sum(a.size for a in jax.tree.leaves(params))


def test_flops_per_token_closed_form():
    c = CFG
    D, N, K, H, F, L, V = (
        c.d_model,
        c.n_heads,
        c.n_kv_heads,
        c.head_dim,
        c.d_ff,
        c.n_layers,
        c.vocab_size,
    )
    per_layer = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F + 2 * D
    n = L * per_layer + V * D + D
    assert param_count(c) == n
    want = 6 * n + 6 * L * N * H * 64  # 12 L N H T, halved by the causal mask
    assert flops_per_token(c, 64) == pytest.approx(want)
    assert flops_per_token(c, 64, training=False) == pytest.approx(want / 3)
    untied = c.replace(tie_embeddings=False)  # the lookup table is free, the head is a matmul
    assert flops_per_token(untied, 64) == pytest.approx(want)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(n_heads=3, n_kv_heads=2), "multiple of n_kv_heads"),
        (dict(attention_impl="flash"), "attention_impl"),
        (dict(rope_scaling={"type": "weird"}), "rope_scaling"),
        (dict(rope_scaling={"type": "linear"}), "'linear' needs a positive 'factor'"),
        (dict(rope_scaling={"type": "ntk", "factor": 0.0}), "'ntk' needs a positive 'factor'"),
        (dict(rope_scaling={"type": "yarn", "factor": 4.0}), "'original_max_position_embeddings'"),
        (dict(dtype="float13"), "dtype"),
        (dict(d_model=0), "d_model"),
    ],
)
def test_bad_config_values_are_named(bad, match):
    with pytest.raises(ValueError, match=match):
        TransformerConfig(**bad)


def test_bad_tokens_are_rejected(params):
    with pytest.raises(ValueError, match="tokens"):
        forward(params, CFG, jnp.zeros((2, 3, 4), jnp.int32))
    with pytest.raises(ValueError, match="segment_ids"):
        forward(params, CFG, jnp.zeros((2, 3), jnp.int32), segment_ids=jnp.zeros((2, 4), jnp.int32))
