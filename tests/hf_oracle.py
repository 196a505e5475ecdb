"""Test helper: tiny random Hugging Face models as oracles for the HF interop tests.

Models are built from their config classes (nothing downloads) and every parameter is randomised:
HF initialises biases to zero and norms to one, which would hide layout mistakes.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.models import forward, param_shapes

# A tiny config every family's class accepts (families add their own fields).
TINY = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=48,
    rms_norm_eps=1e-5,
    rope_theta=500.0,
    max_position_embeddings=64,
    attn_implementation="eager",
)
SEQ = 12
TOKENS = np.random.default_rng(0).integers(0, TINY["vocab_size"], (2, SEQ))

_forward = jax.jit(forward, static_argnums=1)


def hf_model(cls_name: str, **fields):
    """``(torch, model)``: a randomised eval-mode ``AutoModelForCausalLM`` of ``transformers``'
    config class ``cls_name`` with ``fields``; skips without torch or transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, cls_name)(**fields)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    randomise(model, torch)
    return torch, model


def load_hf_model(path):
    """``(torch, model)``: the float32 eval-mode model ``transformers`` loads from ``path``."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    return torch, model


def randomise(model, torch):
    """N(0, 0.1) weights and biases, 1 + N(0, 0.1) norm scales; N(0, 0.1) DeepSeek router
    selection biases too (buffers, zero at initialisation)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.1)


def hf_logits(model, torch, tokens=TOKENS):
    with torch.no_grad():
        return model(torch.as_tensor(tokens)).logits.float().numpy()


def our_logits(params, config, tokens=TOKENS):
    return _forward(params, config, tokens)


def random_params(config, seed=0):
    """N(0, 0.1) everything, norms around one: random biases and norms check their layout too.
    Drawn with numpy, as eager jax.random would compile a kernel per new shape."""
    rng = np.random.default_rng(seed)

    def draw(path, spec):
        offset = 1.0 if "norm" in jax.tree_util.keystr(path) else 0.0
        return jnp.asarray(rng.normal(offset, 0.1, spec.shape), spec.dtype)

    return jax.tree_util.tree_map_with_path(draw, param_shapes(config))


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
