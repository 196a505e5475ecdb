"""Pallas flash attention (interpret mode on CPU) against the pure-jnp reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.models import chunked_attention
from pallas_kernels import BlockSizes, flash_attention, reference_attention
from pallas_kernels.backend import INTERPRET_COMPILER_OPTIONS
from pallas_kernels.block_sizes import plan_tiling

# Worst-case |error| relative to max(1, max |reference|), per dtype of q, k, v.  bf16
# results round to 8 significant bits, so kernel and reference (which sum in different
# orders) may differ by one or two bf16 ulps (2^-8 relative each).
TOLERANCE = {jnp.float32: 2e-5, jnp.bfloat16: 1e-2}

# bf16 against the f32 oracle (the reference on the same inputs, upcast): normwise relative
# error ||got - oracle|| / ||oracle||.  The output only pays for rounding P and O to bf16
# (the bf16 reference's own error is ~2.5e-3).  The gradients also round dS to bf16 before
# the dQ and dK matmuls and form rowsum(dO * O) from the bf16 O, as FlashAttention-2 does;
# measured worst cases over many draws were 2.5e-3 (out) and 5.2e-3 (dq, dk with segments).
BF16_VS_F32 = {"out": 3e-3, "dq": 8e-3, "dk": 8e-3, "dv": 8e-3}

FEATURES = {
    "causal": dict(causal=True),
    "bidirectional": dict(causal=False),
    "causal_window": dict(causal=True, sliding_window=True),
    "bidirectional_window": dict(causal=False, sliding_window=True),
    "segments": dict(causal=True, segment_ids=True),
    "soft_cap": dict(causal=False, logits_soft_cap=True),
}


@st.composite
def problems(draw, feature):
    """Random shapes, GQA ratio and tiles; lengths need not be tile multiples.

    Strategies are ordered so that hypothesis' first (simplest) example is already a useful
    one: self-attention (T == S) with GQA, batch 2 and a length that is no tile multiple.
    """
    spec = FEATURES[feature]
    s = draw(st.integers(17, 48))
    t = s - draw(st.integers(0, s - 1))
    kv_heads, groups = draw(st.sampled_from([2, 1])), draw(st.sampled_from([2, 3, 1]))
    dims = dict(
        b=draw(st.sampled_from([2, 1])),
        t=t,
        s=s,
        n=kv_heads * groups,
        k=kv_heads,
        h=draw(st.sampled_from([16, 8])),
    )
    blocks = BlockSizes(*(draw(st.sampled_from([16, 8])) for _ in range(4)))
    kwargs = dict(causal=spec["causal"], sm_scale=draw(st.sampled_from([None, 0.3])))
    if spec.get("sliding_window"):
        kwargs["sliding_window"] = s // 3 + draw(st.integers(0, s))
    if spec.get("logits_soft_cap"):
        kwargs["logits_soft_cap"] = draw(st.sampled_from([5.0, 0.5]))
    if spec.get("segment_ids"):
        # Packed sequences: ids step up at random cut points; queries are the last T keys.
        cuts = [
            draw(st.lists(st.integers(1, s - 1), min_size=1, max_size=3)) for _ in range(dims["b"])
        ]
        kv_ids = np.stack([(np.arange(s)[:, None] >= np.array(c)).sum(-1) for c in cuts])
        kwargs["segment_ids"] = (jnp.asarray(kv_ids[:, s - t :]), jnp.asarray(kv_ids))
    return dims, blocks, kwargs, draw(st.integers(0, 2**16))


def random_qkv(dims, dtype, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((dims["b"], dims["t"], dims["n"], dims["h"]))
    k, v = rng.standard_normal((2, dims["b"], dims["s"], dims["k"], dims["h"]))
    return tuple(jnp.asarray(x, dtype) for x in (q, k, v))


def output_and_grads(fn, q, k, v, **kwargs):
    """(out, dq, dk, dv) for a random output cotangent, compiled as one program."""

    def run(q, k, v, kwargs):
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, **kwargs), q, k, v)
        cotangent = jax.random.normal(jax.random.key(7), out.shape, jnp.bfloat16).astype(out.dtype)
        return (out, *vjp(cotangent))

    arrays = {name: x for name, x in kwargs.items() if isinstance(x, (tuple, jax.Array))}
    static = {name: x for name, x in kwargs.items() if name not in arrays}
    return jax.jit(
        lambda q, k, v, arrays: run(q, k, v, {**arrays, **static}),
        compiler_options=INTERPRET_COMPILER_OPTIONS,
    )(q, k, v, arrays)


def assert_close(got, want, dtype, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert np.isfinite(got).all(), what
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    assert err <= TOLERANCE[dtype], f"{what}: relative error {err:.2e}"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("feature", sorted(FEATURES))
@settings(max_examples=2)
@given(data=st.data())
def test_forward_and_gradients_match_reference(feature, dtype, data):
    dims, blocks, kwargs, seed = data.draw(problems(feature))
    q, k, v = random_qkv(dims, dtype, seed)
    got = output_and_grads(flash_attention, q, k, v, block_sizes=blocks, interpret=True, **kwargs)
    want = output_and_grads(reference_attention, q, k, v, **kwargs)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == b.dtype == dtype
        assert_close(a, b, dtype, f"{name} {dims} {kwargs}")
    if dtype == jnp.bfloat16:
        upcast = (x.astype(jnp.float32) for x in (q, k, v))
        oracle = output_and_grads(reference_attention, *upcast, **kwargs)
        for name, a, o in zip(("out", "dq", "dk", "dv"), got, oracle):
            a, o = np.asarray(a, np.float64), np.asarray(o, np.float64)
            err = np.linalg.norm(a - o) / max(np.linalg.norm(o), 1e-30)
            assert err <= BF16_VS_F32[name], f"{name} vs f32 oracle: {err:.2e} {dims} {kwargs}"


def test_fully_masked_rows_are_zero_with_finite_gradients():
    dims = dict(b=2, t=12, s=20, n=4, k=2, h=8)
    q, k, v = random_qkv(dims, jnp.float32, 0)
    kv_ids = jnp.broadcast_to(jnp.repeat(jnp.arange(4), 5), (2, 20))
    q_ids = kv_ids[:, 8:].at[:, ::3].set(9)  # segment 9 has no keys
    kwargs = dict(segment_ids=(q_ids, kv_ids), sliding_window=6)
    got = output_and_grads(
        flash_attention, q, k, v, block_sizes=BlockSizes(8, 8, 8, 8), interpret=True, **kwargs
    )
    want = output_and_grads(reference_attention, q, k, v, **kwargs)
    np.testing.assert_array_equal(got[0][:, ::3], 0.0)
    assert np.abs(np.asarray(got[0][:, 1::3])).min() > 0
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert_close(a, b, jnp.float32, name)
    np.testing.assert_array_equal(got[1][:, ::3], 0.0)  # no key, no gradient to that query


def test_bf16_inputs_accumulate_in_f32():
    """With q = 0 the output is the mean of 4096 bf16 values: summed in bf16 it would be off
    by several percent, summed in f32 it is the exact mean rounded once to bf16."""
    v = jax.random.uniform(jax.random.key(0), (1, 4096, 1, 8), jnp.bfloat16, 1.0, 2.0)
    q, k = jnp.zeros((1, 1, 1, 8), jnp.bfloat16), jnp.zeros_like(v)
    out = flash_attention(
        q, k, v, causal=False, block_sizes=BlockSizes(8, 4096, 8, 512), interpret=True
    )
    mean = np.asarray(v, np.float64).mean(axis=1)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out[:, 0], np.float64), mean, rtol=2**-8)


def test_lengths_are_padded_to_whole_tiles():
    tiling = plan_tiling(BlockSizes(16, 32, 8, 64), 20, 50, check_tpu_layout=False)
    tiles = (tiling.block_q, tiling.block_kv, tiling.block_q_bwd, tiling.block_kv_bwd)
    assert tiles == (16, 32, 8, 64)
    assert (tiling.q_padded, tiling.kv_padded) == (32, 64)
    tpu = plan_tiling(BlockSizes(512, 512, 256, 256), 300, 1000, check_tpu_layout=True)
    assert (tpu.block_q, tpu.block_q_bwd, tpu.q_padded) == (512, 256, 512)
    assert (tpu.block_kv, tpu.kv_padded) == (512, 1024)
    small = plan_tiling(BlockSizes(), 3, 5, check_tpu_layout=True)
    assert (small.block_q, small.block_kv, small.q_padded, small.kv_padded) == (8, 8, 8, 8)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: BlockSizes(block_q=12), "multiple of 8"),
        (lambda: BlockSizes(block_kv=0), "multiple of 8"),
        (
            lambda: plan_tiling(BlockSizes(block_kv=64), 8, 1000, check_tpu_layout=True),
            "multiple of 128",
        ),
    ],
)
def test_bad_block_sizes_raise_clear_errors(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    "shapes, kwargs, message",
    [
        (((1, 9, 2, 8), (1, 8, 1, 8), (1, 8, 1, 8)), {}, "exceeds key length"),
        (((1, 8, 3, 8), (1, 8, 2, 8), (1, 8, 2, 8)), {}, "multiple of kv heads"),
        (((1, 8, 2, 8), (1, 8, 1, 8), (1, 8, 1, 8)), dict(sliding_window=0), "sliding_window"),
        (((1, 8, 2, 8), (1, 8, 1, 8), (1, 8, 1, 8)), dict(logits_soft_cap=-1.0), "soft_cap"),
    ],
)
@pytest.mark.parametrize(
    "attend",
    [functools.partial(flash_attention, interpret=True), reference_attention, chunked_attention],
    ids=["flash", "reference", "xla_chunked"],
)
def test_bad_inputs_raise_clear_errors(attend, shapes, kwargs, message):
    q, k, v = (jnp.zeros(shape) for shape in shapes)
    with pytest.raises(ValueError, match=message):
        attend(q, k, v, **kwargs)


def test_a_numpy_integer_window_is_a_window():
    q, k, v = (
        jax.random.normal(key, (1, 16, 2, 8)) for key in jax.random.split(jax.random.key(0), 3)
    )
    expected = reference_attention(q, k, v, sliding_window=4)
    for window in (np.int32(4), np.int64(4)):
        got = flash_attention(
            q, k, v, sliding_window=window, interpret=True, block_sizes=BlockSizes(8, 8, 8, 8)
        )
        np.testing.assert_allclose(got, expected, atol=2e-5)


def test_mixed_dtypes_and_compiled_mode_on_cpu_are_refused():
    q = jnp.zeros((1, 8, 2, 8), jnp.bfloat16)
    k = jnp.zeros((1, 8, 1, 8))
    with pytest.raises(ValueError, match="share a dtype"):
        flash_attention(q, k, k, interpret=True)
    with pytest.raises(NotImplementedError, match="Mosaic TPU"):
        flash_attention(k[:, :, :1], k, k, interpret=False)
