"""The dequantising matmul's Triton kernels compiled on a real GPU, against the f32 reference.

Runs only where JAX's default backend is a GPU (``bash bench/gpu_check.sh`` runs it);
elsewhere it is skipped.  On CPU, ``test_pallas_dequant_matmul.py`` interprets the same kernel
source and lowers it to Triton IR; only a GPU shows that Triton compiles it to PTX and that
the compiled kernels compute the same products and input gradients.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.models import TransformerConfig, forward, init_params
from agentic_jax.models.quantization import quantize, quantize_params
from pallas_kernels.dequant_matmul import dequant_matmul, dequant_matmul_reference

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")

# (fmt, group_size, symmetric, K, N): the shipped configs' int4 groups of 32 and d_ff 352, a
# default int4 (groups of 128) and a per-channel int8 with Llama-7B's d_ff.
CASES = [
    ("int4", 32, False, 352, 1024),
    ("int4", 128, True, 1024, 352),
    ("int8", None, True, 1024, 11008),
    ("int8", 64, False, 512, 256),
]


@pytest.mark.parametrize("rows", [1, 300], ids=["decode", "prefill"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("fmt, group_size, symmetric, k, n", CASES)
def test_compiled_kernels_match_the_reference(fmt, group_size, symmetric, k, n, dtype, rows):
    rng = np.random.default_rng(0)
    w = quantize(
        rng.standard_normal((k, n)).astype(np.float32),
        fmt,
        group_size=group_size,
        symmetric=symmetric,
    )
    arrays = (w.codes, w.scales, w.zeros)
    options = dict(bits=4 if fmt == "int4" else 8, group_size=w.group_size)
    x = jnp.asarray(rng.standard_normal((rows, k)), dtype)
    cotangent = jnp.asarray(rng.standard_normal((rows, n)), jnp.float32)

    def value_and_dx(fn):
        def pairing(x):
            y = fn(x, *arrays, **options)
            return jnp.vdot(y.astype(jnp.float32), cotangent), y

        (_, y), dx = jax.jit(jax.value_and_grad(pairing, has_aux=True))(x)
        return y, dx

    got = value_and_dx(functools.partial(dequant_matmul, kernels="triton", interpret=False))
    want = value_and_dx(dequant_matmul_reference)
    tol = 5e-3 if dtype == jnp.float32 else 1e-2  # tl.dot may take f32 as TF32; bf16: rounding
    for label, a, b in zip(("y", "dx"), got, want):
        assert a.dtype == dtype
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.linalg.norm(a - b) / np.linalg.norm(b)
        assert err <= tol, f"{label}: {err:.2e}"


def test_a_quantised_model_gives_the_same_logits_through_the_kernels():
    config = TransformerConfig(
        vocab_size=256, d_model=256, head_dim=64, d_ff=512, max_seq_len=64, dtype="bfloat16"
    )
    params = quantize_params(init_params(config, jax.random.key(0)), config, "int4")
    tokens = jax.random.randint(jax.random.key(1), (2, 64), 0, config.vocab_size)
    xla = jax.jit(lambda p: forward(p, config, tokens))(params)
    kernel_config = config.replace(quantized_matmul="pallas")
    kernel = jax.jit(lambda p: forward(p, kernel_config, tokens))(params)
    a, b = np.asarray(kernel, np.float64), np.asarray(xla, np.float64)
    assert np.linalg.norm(a - b) / np.linalg.norm(b) <= 2e-2
