"""The dequantising matmul: both kernel families interpreted against the float reference and
against ``QuantizedWeight.dequantize`` (the storage layout), its gradient, the model behind
``quantized_matmul="pallas"``, its refusals, and its lowering to Triton and Mosaic.

What only a GPU shows (Triton's compile to PTX, speed) is ``tests/test_gpu_dequant_matmul.py``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.models import TransformerConfig, forward, init_params
from agentic_jax.models.quantization import quantize, quantize_params
from pallas_kernels.backend import INTERPRET_COMPILER_OPTIONS, lower_for_gpu, lower_for_tpu
from pallas_kernels.dequant_matmul import dequant_matmul, dequant_matmul_reference

Spec = jax.ShapeDtypeStruct
KERNELS = ["mosaic_tpu", "triton"]


def storage(w):
    """The kernel's arguments for a QuantizedWeight."""
    return (w.codes, w.scales, w.zeros), dict(
        bits=4 if w.fmt == "int4" else 8, group_size=w.group_size
    )


@functools.partial(
    jax.jit,
    static_argnames=("options", "kernels", "blocks"),
    compiler_options=INTERPRET_COMPILER_OPTIONS,
)
def value_and_dx(x, arrays, cotangent, options, kernels, blocks):
    """Output and ``d<out, cotangent>/dx`` of the kernel (interpreted) and of the reference."""
    kernel = functools.partial(
        dequant_matmul, kernels=kernels, interpret=True, block_sizes=blocks, **dict(options)
    )
    reference = functools.partial(dequant_matmul_reference, **dict(options))

    def pairing(fn, x):
        return jnp.vdot(fn(x, *arrays).astype(jnp.float32), cotangent)

    functions = (kernel, reference)
    return [fn(x, *arrays) for fn in functions], [
        jax.grad(functools.partial(pairing, fn))(x) for fn in functions
    ]


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30)


@settings(max_examples=8, deadline=None)
@given(data=st.data())
def test_drawn_formats_groups_and_shapes_match_the_reference(data):
    """int8 / int4, symmetric or with zero points, per-group or per-channel, any number of
    rows (padded to the row tile), tiles smaller than a group (several steps per scale row)."""
    kernels = data.draw(st.sampled_from(KERNELS), "kernels")
    fmt = data.draw(st.sampled_from(["int8", "int4"]), "fmt")
    parities = 2 if fmt == "int4" else 1
    group_rows = data.draw(st.sampled_from([16, 32, 64] if kernels == "triton" else [32, 64]))
    k = group_rows * parities * data.draw(st.integers(1, 3), "groups")
    per_channel = fmt == "int8" and data.draw(st.booleans(), "per_channel")
    n = data.draw(st.sampled_from([16, 48, 160]), "n")
    lead = data.draw(st.sampled_from([(1,), (7,), (2, 13), (40,)]), "lead")
    dtype = data.draw(st.sampled_from([jnp.float32, jnp.bfloat16]), "dtype")
    blocks = (16, data.draw(st.sampled_from([16, 32, 128])), data.draw(st.sampled_from([32, 64])))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), "seed"))
    weight = quantize(
        rng.normal(data.draw(st.floats(-1, 1), "offset"), 1.0, (k, n)).astype(np.float32),
        fmt,
        group_size=k if per_channel else group_rows * parities,
        symmetric=data.draw(st.booleans(), "symmetric"),
    )
    arrays, options = storage(weight)
    x = jnp.asarray(rng.standard_normal((*lead, k)), dtype)
    cotangent = jnp.asarray(rng.standard_normal((*lead, n)), jnp.float32)
    (got, want), (dx, dx_want) = value_and_dx(
        x, arrays, cotangent, tuple(options.items()), kernels, blocks
    )
    assert got.shape == (*lead, n) and got.dtype == dtype and dx.dtype == dtype
    layout = np.asarray(x, np.float32) @ np.asarray(weight.dequantize())
    tol = 1e-5 if dtype == jnp.float32 else 1e-2  # bf16: about one rounding of the output
    assert relative_error(want, layout) <= tol
    assert relative_error(got, want) <= tol
    assert relative_error(dx, dx_want) <= tol


# The default model's widths (d_model 64, 4 query and 2 kv heads of 16) with a d_ff the kernels
# tile and an untied head (the LM head stays float: it keeps the dequantise path).
TINY = TransformerConfig(vocab_size=61, d_ff=128, max_seq_len=32, tie_embeddings=False)
TOKENS = jax.random.randint(jax.random.key(1), (2, 9), 0, TINY.vocab_size)


@functools.partial(jax.jit, static_argnums=2, compiler_options=INTERPRET_COMPILER_OPTIONS)
def logits_and_embedding_grad(embed, params, config):
    def loss(embed):
        logits = forward({**params, "embed": embed}, config, TOKENS[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, TOKENS[:, 1:]).mean(), logits

    (_, logits), grad = jax.value_and_grad(loss, has_aux=True)(embed)
    return logits, grad


def test_quantised_model_logits_and_gradients_are_the_kernels():
    """Every attention and MLP projection (int4, zero points, groups of 64) through the
    interpreted kernel (the CPU default of ``quantized_matmul="pallas"``) gives the logits, and
    through its dx kernel the gradient reaching the embedding, of dequantise-then-einsum."""
    params = quantize_params(
        init_params(TINY, jax.random.key(0)), TINY, "int4", group_size=64, symmetric=False
    )
    embed = params["embed"]
    logits, grad = logits_and_embedding_grad(embed, params, TINY)
    kernel_logits, kernel_grad = logits_and_embedding_grad(
        embed, params, TINY.replace(quantized_matmul="pallas")
    )
    np.testing.assert_allclose(kernel_logits, logits, atol=1e-5)
    np.testing.assert_allclose(kernel_grad, grad, atol=1e-6)


def test_the_default_cpu_path_stays_dequantise_then_einsum():
    params = quantize_params(init_params(TINY, jax.random.key(0)), TINY, "int8")

    def jaxpr(config):
        return str(jax.make_jaxpr(lambda p: forward(p, config, TOKENS))(params))

    assert "dequant_matmul" not in jaxpr(TINY)
    assert "dequant_matmul_fwd" in jaxpr(TINY.replace(quantized_matmul="pallas"))


def small_weight(fmt="int4", group_size=64, k=128, n=48, symmetric=True):
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    return quantize(w, fmt, group_size=group_size, symmetric=symmetric)


@pytest.mark.parametrize(
    "kernels, weight, match",
    [
        ("mosaic_tpu", small_weight(group_size=32), "group_size=32 of int4 .* multiple of 64"),
        ("triton", small_weight(group_size=16), "group_size=16 of int4 .* multiple of 32"),
        ("triton", small_weight("int8", group_size=32, n=40), "40 output columns"),
    ],
)
def test_tiles_a_family_cannot_take_are_refused(kernels, weight, match):
    arrays, options = storage(weight)
    x = jnp.zeros((3, weight.in_shape[0]))
    with pytest.raises(ValueError, match=match):
        dequant_matmul(x, *arrays, **options, kernels=kernels, interpret=True)


def test_bad_storage_families_and_platforms_are_named():
    weight = small_weight("int8", group_size=32, symmetric=False)
    (codes, scales, zeros), options = storage(weight)
    x = jnp.zeros((3, 128))
    with pytest.raises(ValueError, match="asymmetric codes are uint8"):
        dequant_matmul(x, codes.astype(jnp.int8), scales, zeros, **options)
    with pytest.raises(ValueError, match=r"codes .* must be \[64, N\]"):
        dequant_matmul(x, codes, scales, zeros, bits=4, group_size=32)
    with pytest.raises(ValueError, match="must divide x's 128 inputs"):
        dequant_matmul(x, codes, scales, zeros, bits=8, group_size=48)
    with pytest.raises(ValueError, match="block_m=24 must be a power of two"):
        dequant_matmul(x, codes, scales, zeros, **options, block_sizes=(24, 128, 64))
    with pytest.raises(ValueError, match="kernels must be one of"):
        dequant_matmul(x, codes, scales, zeros, **options, kernels="cuda")
    with pytest.raises(NotImplementedError, match="Triton lowering"):
        dequant_matmul(x, codes, scales, zeros, **options, kernels="triton", interpret=False)
    with pytest.raises(ValueError, match="fmt='nf4'"):
        small_weight("nf4").matmul(x)
    with pytest.raises(ValueError, match="no FP8 path"):
        TINY.replace(quantized_matmul="pallas", matmul_precision="fp8")
    with pytest.raises(ValueError, match="quantized_matmul='cuda'"):
        TINY.replace(quantized_matmul="cuda")


# (bits, group_size, zero points, output columns): Llama-7B-like projections, including the
# shipped configs' int4 groups of 32 (Triton only) and a per-channel int8 with N = 11008.
LOWERING_CASES = {
    "int4_g128": (4, 128, False, 4096),
    "int4_g32_asym": (4, 32, True, 352),
    "int8_per_channel": (8, 4096, False, 11008),
    "int8_g128_asym": (8, 128, True, 4096),
}


def lowering_args(bits, group_size, zeros, n, k=4096):
    dtype = jnp.uint8 if bits == 4 or zeros else jnp.int8
    args = [
        Spec((4, 7, k), jnp.bfloat16),
        Spec((k // 2 if bits == 4 else k, n), dtype),
        Spec((k // group_size, n), jnp.float32),
    ]
    return args + [Spec((k // group_size, n), jnp.uint8)] if zeros else args


def loss_of(bits, group_size):
    def loss(x, codes, scales, zeros=None):
        y = dequant_matmul(x, codes, scales, zeros, bits=bits, group_size=group_size)
        return jnp.sum(y.astype(jnp.float32) ** 2)

    return loss


@pytest.mark.parametrize("case", sorted(LOWERING_CASES))
def test_forward_and_dx_lower_to_triton_for_a_gpu(case):
    bits, group_size, zeros, n = LOWERING_CASES[case]
    args = lowering_args(bits, group_size, zeros, n)
    loss = loss_of(bits, group_size)
    assert lower_for_gpu(loss, *args).as_text().count("xla.gpu.triton") == 1
    grads = lower_for_gpu(jax.grad(loss), *args).as_text()
    assert grads.count("xla.gpu.triton") == 2 and "tpu_custom_call" not in grads


@pytest.mark.parametrize("device_kind", ["TPU v4", "TPU v5 lite", "TPU v6 lite"])
@pytest.mark.parametrize("case", ["int4_g128", "int8_per_channel", "int8_g128_asym"])
def test_forward_and_dx_lower_to_mosaic_for_a_tpu(case, device_kind):
    bits, group_size, zeros, n = LOWERING_CASES[case]
    args = lowering_args(bits, group_size, zeros, n)
    loss = loss_of(bits, group_size)
    grads = lower_for_tpu(jax.grad(loss), *args, device_kind=device_kind).as_text()
    assert grads.count("tpu_custom_call") == 2  # forward, dx


def test_a_quantised_model_lowers_to_the_kernels_on_gpu_and_tpu():
    """Scanned layers: the body holds the kernels of the projections, one per distinct
    projection shape (k and v, gate and up share theirs): q, k/v, o, gate/up, down."""
    config = TINY.replace(quantized_matmul="pallas", dtype="bfloat16", d_model=256, d_ff=512)
    params = jax.eval_shape(
        lambda: quantize_params(init_params(config, jax.random.key(0)), config, "int4")
    )
    tokens = Spec((2, 32), jnp.int32)
    gpu = lower_for_gpu(lambda p, x: forward(p, config, x), params, tokens).as_text()
    tpu = lower_for_tpu(lambda p, x: forward(p, config, x), params, tokens).as_text()
    assert gpu.count("xla.gpu.triton") == 5 and tpu.count("tpu_custom_call") == 5
