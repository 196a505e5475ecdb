"""The GPU attention paths on a real GPU: cuDNN, tokamax and this package's Triton kernels
(flash attention, paged decode) against the f32 reference.

Runs only where JAX's default backend is a GPU, e.g.
``JAX_PLATFORMS=cuda python -m pytest tests/test_gpu_attention.py``; elsewhere it is skipped.
On CPU, ``test_pallas_dispatch.py`` checks the same translation of the mask rule with XLA
standing in for cuDNN; only a GPU shows that cuDNN and tokamax accept those arguments and
compute the same attention, forward and backward.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.models import TransformerConfig, forward, init_params
from pallas_kernels import (
    dispatch,
    flash_attention,
    gpu_attention,
    paged_attention_reference,
    paged_attention_triton,
    reference_attention,
)

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")

BACKENDS = [
    "cudnn",
    pytest.param(
        "tokamax",
        marks=pytest.mark.skipif(
            dispatch.tokamax_module() is None, reason="tokamax does not import"
        ),
    ),
]
S = 256
# (name, T, options, backends that take the call): cuDNN has no soft cap and no two-sided window.
CASES = [
    ("causal", S, dict(causal=True), {"cudnn", "tokamax"}),
    ("full", S, dict(causal=False), {"cudnn", "tokamax"}),
    ("prefix", S // 2, dict(causal=True), {"cudnn", "tokamax"}),
    ("window", S, dict(causal=True, sliding_window=40), {"cudnn", "tokamax"}),
    ("window_prefix", S // 2, dict(causal=True, sliding_window=40), {"cudnn", "tokamax"}),
    ("segments", S, dict(causal=True, segment_ids=True), {"cudnn", "tokamax"}),
    ("segments_empty_rows", S // 2, dict(causal=False, segment_ids=True), {"cudnn", "tokamax"}),
    ("soft_cap", S, dict(causal=True, logits_soft_cap=5.0), {"tokamax"}),
    ("two_sided_window", S, dict(causal=False, sliding_window=40), {"tokamax"}),
]


def _inputs(t, options, seed=0):
    rng = np.random.default_rng(seed)
    q, k, v = (
        jnp.asarray(rng.standard_normal(shape), jnp.bfloat16)
        for shape in ((2, t, 8, 64), (2, S, 2, 64), (2, S, 2, 64))
    )
    cotangent = jnp.asarray(rng.standard_normal((2, t, 8, 64)), jnp.float32)
    options = dict(options)
    if options.pop("segment_ids", False):
        kv_ids = np.repeat(np.arange(1, 5), S // 4)[None].repeat(2, axis=0)
        q_ids = kv_ids[:, S - t :].copy()
        q_ids[:, ::7] = 9  # segment 9 has no keys: rows of zeros
        options["segment_ids"] = (jnp.asarray(q_ids), jnp.asarray(kv_ids))
    return (q, k, v), cotangent, options


def _value_and_grads(fn, qkv, cotangent):
    out, vjp = jax.vjp(lambda *a: fn(*a).astype(jnp.float32), *qkv)
    return out, vjp(cotangent)


def assert_matches_f32_reference(got, got_grads, qkv, cotangent, options):
    """bf16 output and gradients within 2e-2 of the f32 reference (relative to each
    gradient's largest entry)."""
    f32 = tuple(x.astype(jnp.float32) for x in qkv)
    want, want_grads = jax.jit(
        lambda *a: _value_and_grads(lambda *b: reference_attention(*b, **options), a, cotangent)
    )(*f32)
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)
    for label, g, w in zip("qkv", got_grads, want_grads):
        scale = float(jnp.max(jnp.abs(w)))
        np.testing.assert_allclose(g, w, atol=2e-2 * scale, err_msg=f"d{label}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name, t, options, takes", CASES, ids=[c[0] for c in CASES])
def test_fused_backend_equals_reference(monkeypatch, backend, name, t, options, takes):
    if backend not in takes:
        pytest.skip(f"{backend} does not take {name}; the dispatch sends it elsewhere")
    monkeypatch.setattr(dispatch, "choose_attention_backend", lambda *a, **k: backend)
    qkv, cotangent, options = _inputs(t, options)
    used = []

    def fused(*args):
        out, chosen = gpu_attention(*args, return_backend=True, **options)
        used.append(chosen)
        return out

    got, got_grads = jax.jit(lambda *a: _value_and_grads(fused, a, cotangent))(*qkv)
    assert used == [backend], f"{backend} rejected the call and fell back to {used}"
    assert_matches_f32_reference(got, got_grads, qkv, cotangent, options)


# bf16 inputs, f32 accumulation: the kernel rounds P to bf16 before P V (and dS before dS K,
# dS^T Q), as cuDNN and FlashAttention-2 do, so its error against the f32 reference is a few
# bf16 ulps (2^-8 relative) of the largest value, the bound the cuDNN test above uses.
@pytest.mark.parametrize("name, t, options, takes", CASES, ids=[c[0] for c in CASES])
def test_triton_flash_kernel_equals_reference(name, t, options, takes):
    del takes  # the Triton kernels take every case
    qkv, cotangent, options = _inputs(t, options)
    got, got_grads = jax.jit(
        lambda *a: _value_and_grads(
            lambda *b: flash_attention(*b, kernels="triton", **options), a, cotangent
        )
    )(*qkv)
    assert_matches_f32_reference(got, got_grads, qkv, cotangent, options)


@pytest.mark.parametrize("options", [{}, dict(sliding_window=40), dict(logits_soft_cap=5.0)])
def test_triton_paged_decode_equals_reference(options):
    """Serving-sized pages (16 tokens, head_dim 128, 8 query heads over 2 kv heads) scattered
    through the pool; lengths from empty to the table's capacity."""
    rng = np.random.default_rng(0)
    b, max_pages, num_pages = 4, 8, 40
    q = jnp.asarray(rng.standard_normal((b, 8, 128)), jnp.bfloat16)
    k_pages, v_pages = (
        jnp.asarray(rng.standard_normal((num_pages, 16, 2, 128)), jnp.bfloat16) for _ in range(2)
    )
    table = jnp.asarray(rng.permutation(num_pages)[: b * max_pages].reshape(b, max_pages))
    lengths = jnp.asarray([128, 77, 1, 0], jnp.int32)
    got = jax.jit(lambda *a: paged_attention_triton(*a, **options))(
        q, k_pages, v_pages, table, lengths
    )
    f32 = (x.astype(jnp.float32) for x in (q, k_pages, v_pages))
    want = paged_attention_reference(*f32, table, lengths, **options)
    np.testing.assert_allclose(np.asarray(got, np.float32), want, atol=2e-2, rtol=2e-2)


def test_model_logits_through_the_gpu_dispatch_equal_xla():
    cfg = TransformerConfig(
        vocab_size=97,
        d_model=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=32,
        d_ff=256,
        max_seq_len=128,
        dtype="bfloat16",
    )
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, cfg.vocab_size)
    logits = {
        impl: jax.jit(lambda p, c=cfg.replace(attention_impl=impl): forward(p, c, tokens))(
            params
        ).astype(jnp.float32)
        for impl in ("xla", "cudnn", "pallas")
    }
    scale = float(jnp.max(jnp.abs(logits["xla"])))
    for impl in ("cudnn", "pallas"):
        np.testing.assert_allclose(logits[impl], logits["xla"], atol=2e-2 * scale, err_msg=impl)
