"""QK-norm (per head and over the full width), sliding/global layer patterns, logit soft-caps,
LayerNorm, Gemma's 1 + w RMSNorm, post/sandwich norms, GeGLU, scaled embeddings and Gemma 2's
attention scale: each against a slow float64 numpy transcription of the model; the default
config unchanged."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_oracle import (
    assert_engine_matches_forward,
    assert_generate_matches_forward,
    loss_decreases,
    prompts,
    random_params,
)

from agentic_jax.models import TransformerConfig, forward, init_params

BASE = TransformerConfig(
    vocab_size=61,
    d_model=32,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=8,
    d_ff=48,
    max_seq_len=32,
)
VARIANTS = {
    "qk_norm": dict(qk_norm=True),
    "qk_norm_full": dict(qk_norm=True, qk_norm_scope="full"),
    "softcaps": dict(attn_logit_softcap=2.0, final_logit_softcap=3.0),
    "sliding_every_2nd_global": dict(sliding_window=3, sliding_window_pattern=2),
    "layer_types": dict(
        sliding_window=2,
        sliding_window_pattern=("full_attention", "sliding_attention"),
    ),
    "layer_norm": dict(norm_type="layer"),
    "post_norm": dict(norm_position="post"),
    "gemma2_like": dict(
        norm_position="sandwich",
        sliding_window=3,
        sliding_window_pattern=2,
        attn_logit_softcap=5.0,
        final_logit_softcap=4.0,
        qk_norm=True,
        norm_type="rms_plus_one",
        mlp_activation="gelu_tanh",
        scale_embeddings=True,
        query_pre_attn_scalar=12.0,
    ),
}


def _norm(c, x, w, b):
    if c.norm_type == "layer":
        x = x - x.mean(-1, keepdims=True)
        return x / np.sqrt((x**2).mean(-1, keepdims=True) + c.norm_eps) * w + b
    scale = 1 + w if c.norm_type == "rms_plus_one" else w
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + c.norm_eps) * scale


def _qk_norm(c, x, w):
    """RMSNorm of ``x[T, heads, H]`` per head, or over all heads' features (``full``)."""
    rms = c.replace(norm_type="rms")
    if c.qk_norm_scope == "head":
        return _norm(rms, x, w, 0)
    return _norm(rms, x.reshape(len(x), -1), w.reshape(-1), 0).reshape(x.shape)


def _activation(c, g):
    if c.mlp_activation == "gelu_tanh":
        return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    return g / (1 + np.exp(-g))


def _rope(x, positions, theta):
    half = x.shape[-1] // 2
    angle = positions[:, None] * theta ** (-np.arange(half) * 2 / x.shape[-1])  # [T, H/2]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference_logits(params, c, tokens):
    """One sequence ``tokens[T]`` through the model, written out loop by loop in float64."""
    p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    lay = p["layers"]
    t = len(tokens)
    pos = np.arange(t, dtype=np.float64)
    x = p["embed"][tokens] * (np.sqrt(c.d_model) if c.scale_embeddings else 1.0)
    for i, window in enumerate(c.layer_windows):
        at = jax.tree.map(lambda a, i=i: a[i], lay["attn"])
        mlp = jax.tree.map(lambda a, i=i: a[i], lay["mlp"])

        def norm(name, v, i=i):
            return _norm(c, v, lay[name][i], lay.get(f"{name}_bias", lay[name])[i])

        def attention(h, at=at, window=window):
            q = np.einsum("td,dnh->tnh", h, at["q"])
            k = np.einsum("td,dkh->tkh", h, at["k"])
            v = np.einsum("td,dkh->tkh", h, at["v"])
            if c.qk_norm:
                q, k = _qk_norm(c, q, at["q_norm"]), _qk_norm(c, k, at["k_norm"])
            q, k = _rope(q, pos, c.rope_theta), _rope(k, pos, c.rope_theta)
            out = np.zeros((t, c.n_heads, c.head_dim))
            scalar = c.query_pre_attn_scalar or c.head_dim
            for n in range(c.n_heads):
                kv = n // (c.n_heads // c.n_kv_heads)
                for a in range(t):
                    seen = [b for b in range(a + 1) if window is None or a - b < window]
                    s = np.array([q[a, n] @ k[b, kv] for b in seen]) / np.sqrt(scalar)
                    if c.attn_logit_softcap:
                        s = c.attn_logit_softcap * np.tanh(s / c.attn_logit_softcap)
                    w = np.exp(s - s.max())
                    out[a, n] = (w / w.sum()) @ v[seen, kv]
            return np.einsum("tnh,nhd->td", out, at["o"])

        def ffn(h, mlp=mlp):
            return (_activation(c, h @ mlp["gate"]) * (h @ mlp["up"])) @ mlp["down"]

        for name, f in (("attn", attention), ("mlp", ffn)):
            h = x if c.norm_position == "post" else norm(f"{name}_norm", x)
            y = f(h)
            x = x + (y if c.norm_position == "pre" else norm(f"{name}_post_norm", y))
    x = _norm(c, x, p["final_norm"], p.get("final_norm_bias", 0))
    logits = x @ p["embed"].T
    cap = c.final_logit_softcap
    return logits if cap is None else cap * np.tanh(logits / cap)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_matches_explicit_reference(name):
    config = BASE.replace(**VARIANTS[name])
    params = random_params(config)
    tokens = np.random.default_rng(3).integers(0, config.vocab_size, 7)
    got = forward(params, config, jnp.asarray(tokens)[None])[0]
    np.testing.assert_allclose(got, reference_logits(params, config, tokens), atol=2e-4)


def test_sliding_pattern_layers():
    assert BASE.replace(n_layers=4, **VARIANTS["sliding_every_2nd_global"]).layer_windows == (
        3,
        None,
        3,
        None,
    )
    gemma3 = BASE.replace(n_layers=12, sliding_window=3, sliding_window_pattern=6)
    assert [i for i, w in enumerate(gemma3.layer_windows) if w is None] == [5, 11]
    assert BASE.replace(sliding_window=3).layer_windows == (3, 3)


@pytest.mark.parametrize("name", ["gemma2_like", "qk_norm_full"])
def test_variant_decoding_equals_forward(name):
    """The KV cache and the paged engine apply each layer's window, QK-norm, the soft-caps, the
    attention scale and the embedding scale."""
    config = BASE.replace(**VARIANTS[name])
    params = random_params(config)
    assert_generate_matches_forward(params, config, prompts(config, (6, 2)))
    assert_engine_matches_forward(params, config, prompts(config, (6, 2)))


def test_variants_train():
    first, last = loss_decreases(BASE.replace(**{**VARIANTS["gemma2_like"], "norm_type": "layer"}))
    assert last < first


def test_default_config_is_unchanged():
    """Logits of the default architecture recorded before these variants existed (under the
    suite's XLA flags, conftest.py: the values are those of one compiled program)."""
    config = TransformerConfig(
        vocab_size=64,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=8,
        d_ff=64,
        tie_embeddings=False,
        qkv_bias=True,
    )
    params = init_params(config, jax.random.key(0))
    params = jax.tree.map(
        lambda a: a + 0.05 * jax.random.normal(jax.random.key(1), a.shape), params
    )
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, 64)
    want = np.load(pathlib.Path(__file__).parent / "data" / "default_model_logits.npy")
    np.testing.assert_array_equal(np.asarray(forward(params, config, tokens)), want)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(sliding_window_pattern=2), "needs sliding_window"),
        (dict(sliding_window=2, sliding_window_pattern=0), "interval"),
        (dict(sliding_window=2, sliding_window_pattern=("full_attention",)), "each of the 2"),
        (dict(attn_logit_softcap=0.0), "attn_logit_softcap"),
        (dict(norm_type="batch"), "norm_type"),
        (dict(norm_position="middle"), "norm_position"),
        (dict(qk_norm_scope="full"), "needs qk_norm"),
        (dict(qk_norm=True, qk_norm_scope="layer"), "qk_norm_scope"),
        (dict(mlp_activation="relu"), "mlp_activation"),
        (dict(mlp_activation="gelu_tanh", n_experts=4), "SwiGLU"),
        (dict(query_pre_attn_scalar=0.0), "query_pre_attn_scalar"),
    ],
)
def test_invalid_variant_configs(changes, match):
    with pytest.raises(ValueError, match=match):
        BASE.replace(**changes)
