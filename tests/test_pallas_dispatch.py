"""Backend choice of gpu_attention and its translation of the mask rule to jax.nn arguments."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import choose_attention_backend, dispatch, gpu_attention, reference_attention


def _qkv(t, s, n=4, k=2, h=16, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(
        jnp.asarray(rng.standard_normal(shape), dtype)
        for shape in ((2, t, n, h), (2, s, k, h), (2, s, k, h))
    )


@pytest.mark.parametrize(
    "platform, dtype, options, tokamax, want",
    [
        ("tpu", jnp.float32, {}, False, "pallas"),
        ("cpu", jnp.bfloat16, {}, True, "xla"),
        ("gpu", jnp.bfloat16, {}, True, "tokamax"),
        ("gpu", jnp.bfloat16, dict(sliding_window=4), False, "cudnn"),
        ("gpu", jnp.float32, {}, False, "xla"),
        ("gpu", jnp.bfloat16, dict(logits_soft_cap=30.0), False, "xla"),
        ("gpu", jnp.bfloat16, dict(causal=False, sliding_window=4), False, "xla"),
    ],
)
def test_backend_choice(monkeypatch, platform, dtype, options, tokamax, want):
    monkeypatch.setattr(dispatch, "tokamax_module", lambda: object() if tokamax else None)
    q, k, v = _qkv(8, 8, dtype=dtype)
    assert choose_attention_backend(q, k, v, platform=platform, **options) == want


@pytest.mark.parametrize(
    "t, options",
    [
        (16, dict(causal=True)),
        (16, dict(causal=False)),
        (10, dict(causal=True)),
        (16, dict(causal=True, sliding_window=5)),
        (16, dict(causal=False, sliding_window=5)),
        (10, dict(causal=True, sliding_window=5)),
        (16, dict(causal=True, segment_ids=True)),
        (10, dict(causal=False, segment_ids=True)),  # some queries' segment has no keys
    ],
)
def test_cudnn_call_reproduces_the_mask_rule(monkeypatch, t, options):
    """The whole cuDNN path on CPU, with jax.nn's XLA implementation standing in for cuDNN."""
    calls, jax_nn_attention = [], jax.nn.dot_product_attention

    def xla_instead_of_cudnn(*args, implementation, **kwargs):
        calls.append(implementation)
        return jax_nn_attention(*args, implementation="xla", **kwargs)

    monkeypatch.setattr(dispatch, "choose_attention_backend", lambda *a, **k: "cudnn")
    monkeypatch.setattr(dispatch.jax.nn, "dot_product_attention", xla_instead_of_cudnn)
    q, k, v = _qkv(t, 16)
    if options.pop("segment_ids", False):
        ids = np.repeat([[1, 2, 3, 4]], 4, axis=1).repeat(2, axis=0)
        q_ids = np.where(np.arange(t) % 3 == 0, 7, ids[:, 16 - t :])  # segment 7 has no keys
        options["segment_ids"] = (jnp.asarray(q_ids), jnp.asarray(ids))
    out, backend = gpu_attention(q, k, v, return_backend=True, **options)
    assert backend == "cudnn" and calls == ["cudnn"]
    np.testing.assert_allclose(out, reference_attention(q, k, v, **options), atol=1e-5)


def test_gpu_attention_on_cpu_uses_xla():
    q, k, v = _qkv(8, 12)
    out, backend = gpu_attention(q, k, v, sliding_window=3, return_backend=True)
    assert backend == "xla"
    np.testing.assert_allclose(out, reference_attention(q, k, v, sliding_window=3), atol=1e-6)


def test_rejected_fused_call_falls_back_to_xla_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(dispatch, "choose_attention_backend", lambda *a, **k: "cudnn")
    q, k, v = _qkv(8, 8, dtype=jnp.bfloat16)
    with caplog.at_level(logging.INFO, logger=dispatch.__name__):
        out, backend = gpu_attention(q, k, v, return_backend=True)  # no cuDNN on CPU
    assert backend == "xla"
    assert "cudnn rejected the call" in caplog.text and "using xla" in caplog.text
    np.testing.assert_array_equal(out, reference_attention(q, k, v))


def test_tokamax_that_does_not_import_is_not_used(monkeypatch, caplog):
    """An installed but broken tokamax (a missing dependency, say) must not break GPU attention."""
    monkeypatch.setattr(dispatch.importlib.util, "find_spec", lambda name: object())

    def broken(name):
        raise ModuleNotFoundError("No module named 'qwix'")

    monkeypatch.setattr(dispatch.importlib, "import_module", broken)
    dispatch.tokamax_module.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger=dispatch.__name__):
            q, k, v = _qkv(8, 8, dtype=jnp.bfloat16)
            assert choose_attention_backend(q, k, v, platform="gpu") == "cudnn"
        assert "tokamax is installed but does not import" in caplog.text and "qwix" in caplog.text
    finally:
        dispatch.tokamax_module.cache_clear()
