"""The Triton (NVIDIA GPU) flash-attention and paged decode kernels, on CPU: interpreted
against the reference, and lowered to Triton IR for a GPU this host does not have.

The interpreter runs the kernel source op for op, so values and gradients here are the
kernels' own; what only a GPU shows (Triton's compile to PTX, bf16 tensor-core numerics,
speed) is in ``tests/test_gpu_attention.py`` and ``bench/gpu_check.sh``.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_pallas_flash_attention import (
    BF16_VS_F32,
    assert_close,
    output_and_grads,
    random_qkv,
)

from agentic_jax.models import TransformerConfig, forward, init_params
from pallas_kernels import (
    BlockSizes,
    flash_attention,
    paged_attention_reference,
    paged_attention_triton,
    reference_attention,
)
from pallas_kernels.backend import lower_for_gpu
from pallas_kernels.flash_triton import padded_head_dim, plan_triton_tiling

TILES = BlockSizes(16, 16, 16, 16)
triton_attention = functools.partial(flash_attention, kernels="triton", interpret=True)

# (name, dims, options): GQA (4 query heads over 2 kv heads) throughout; T < S and lengths
# that are no tile multiple exercise the causal offset and the padded keys; head_dim 24 is
# padded to 32 inside.
DIMS = dict(b=2, t=40, s=40, n=4, k=2, h=16)
CASES = [
    ("causal", DIMS, dict(causal=True)),
    ("full", DIMS, dict(causal=False)),
    ("prefix", {**DIMS, "t": 24}, dict(causal=True)),
    ("window", DIMS, dict(causal=True, sliding_window=7)),
    ("two_sided_window", DIMS, dict(causal=False, sliding_window=9)),
    ("segments", {**DIMS, "t": 30}, dict(causal=True, segment_ids=True)),
    ("soft_cap", {**DIMS, "h": 24}, dict(causal=False, logits_soft_cap=2.0)),
]


def packed_segment_ids(b, t, s):
    """Three packed sequences per row (cuts differ by row); every 5th query is given a segment
    with no keys, whose output must be zeros."""
    kv_ids = np.stack(
        [(np.arange(s)[:, None] >= np.array([5 + r, 22 - r])).sum(-1) for r in range(b)]
    )
    q_ids = kv_ids[:, s - t :].copy()
    q_ids[:, ::5] = 9
    return jnp.asarray(q_ids), jnp.asarray(kv_ids)


def with_arrays(dims, options):
    options = dict(options)
    if options.pop("segment_ids", False):
        options["segment_ids"] = packed_segment_ids(dims["b"], dims["t"], dims["s"])
    return options


@pytest.mark.parametrize("name, dims, options", CASES, ids=[c[0] for c in CASES])
def test_every_mask_case_matches_the_reference(name, dims, options):
    options = with_arrays(dims, options)
    q, k, v = random_qkv(dims, jnp.float32, seed=len(name))
    got = output_and_grads(triton_attention, q, k, v, block_sizes=TILES, **options)
    want = output_and_grads(reference_attention, q, k, v, **options)
    for label, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.shape == b.shape and a.dtype == jnp.float32
        assert_close(a, b, jnp.float32, f"{name} {label}")
    if "segment_ids" in options:
        np.testing.assert_array_equal(got[0][:, ::5], 0.0)
        np.testing.assert_array_equal(got[1][:, ::5], 0.0)


@settings(max_examples=6, deadline=None)
@given(data=st.data())
def test_drawn_shapes_and_masks_match_the_reference(data):
    """Shapes, GQA ratios, tiles (16 or 32, possibly larger than the sequence) and masks
    drawn together; bf16 against the f32 oracle with the Mosaic kernel's tolerances (the
    same rounding points: P, dS and O in bf16, f32 accumulation)."""
    s = data.draw(st.integers(17, 48))
    kv_heads, groups = data.draw(st.sampled_from([2, 1])), data.draw(st.sampled_from([2, 1]))
    dims = dict(
        b=data.draw(st.sampled_from([1, 2])),
        t=s - data.draw(st.integers(0, s - 1)),
        s=s,
        n=kv_heads * groups,
        k=kv_heads,
        h=data.draw(st.sampled_from([16, 8])),
    )
    blocks = BlockSizes(*(data.draw(st.sampled_from([16, 32])) for _ in range(4)))
    options = dict(
        causal=data.draw(st.booleans()),
        sliding_window=data.draw(st.one_of(st.none(), st.integers(1, s))),
        logits_soft_cap=data.draw(st.sampled_from([None, 3.0])),
        sm_scale=data.draw(st.sampled_from([None, 0.3])),
    )
    if data.draw(st.booleans()):
        options["segment_ids"] = packed_segment_ids(dims["b"], dims["t"], dims["s"])
    q, k, v = random_qkv(dims, jnp.bfloat16, data.draw(st.integers(0, 2**16)))
    got = output_and_grads(triton_attention, q, k, v, block_sizes=blocks, **options)
    oracle = output_and_grads(
        reference_attention, *(x.astype(jnp.float32) for x in (q, k, v)), **options
    )
    for label, a, o in zip(("out", "dq", "dk", "dv"), got, oracle):
        assert a.dtype == jnp.bfloat16
        a, o = np.asarray(a, np.float64), np.asarray(o, np.float64)
        err = np.linalg.norm(a - o) / max(np.linalg.norm(o), 1e-30)
        assert err <= BF16_VS_F32[label], f"{label}: {err:.2e} {dims} {blocks} {options}"


def test_tiles_are_powers_of_two_and_lengths_are_padded_to_them():
    tiling = plan_triton_tiling(BlockSizes(128, 64, 64, 32), 20, 100)
    assert (tiling.block_q, tiling.block_q_bwd, tiling.q_padded) == (32, 32, 32)
    assert (tiling.block_kv, tiling.block_kv_bwd, tiling.kv_padded) == (64, 32, 128)
    tiny = plan_triton_tiling(BlockSizes(128, 128, 128, 128), 1, 3)
    assert (tiny.block_q, tiny.block_kv, tiny.q_padded, tiny.kv_padded) == (16, 16, 16, 16)
    assert [padded_head_dim(h) for h in (8, 16, 24, 64, 80, 128)] == [16, 16, 32, 64, 128, 128]


@pytest.mark.parametrize("blocks", [BlockSizes(block_q=24), BlockSizes(block_kv_bwd=8)])
def test_tiles_triton_cannot_take_are_refused(blocks):
    with pytest.raises(ValueError, match="power of two >= 16"):
        plan_triton_tiling(blocks, 64, 64)


def test_unknown_kernel_family_and_compiling_triton_on_cpu_are_refused():
    q = jnp.zeros((1, 16, 2, 16))
    with pytest.raises(ValueError, match="kernels must be one of"):
        flash_attention(q, q, q, kernels="cuda")
    with pytest.raises(NotImplementedError, match="Triton lowering"):
        flash_attention(q, q, q, kernels="triton", interpret=False)


def triton_calls(lowered) -> int:
    return lowered.as_text().count("xla.gpu.triton")


Spec = jax.ShapeDtypeStruct
# Production-like shapes: nothing runs, so size costs only tracing time.
LOWERING_CASES = {
    "causal": dict(causal=True),
    "full_mqa": dict(causal=False, kv_heads=1),
    "full_padded": dict(causal=False, t=1000, s=1000),
    "prefix_window": dict(causal=True, t=300, sliding_window=256),
    "two_sided_window": dict(causal=False, sliding_window=256),
    "segments": dict(causal=True, segments=True),
    "soft_cap_f32_head80": dict(causal=True, logits_soft_cap=30.0, dtype=jnp.float32, h=80),
}


@pytest.mark.parametrize("case", sorted(LOWERING_CASES))
def test_forward_and_backward_lower_to_triton_for_a_gpu(case):
    """On a GPU backend ``flash_attention`` (no ``kernels=``) takes the Triton family and every
    op of the three kernels has a Triton lowering with power-of-two shapes."""
    opts = dict(LOWERING_CASES[case])
    t, s, h = opts.pop("t", 512), opts.pop("s", 512), opts.pop("h", 128)
    dtype, kv_heads = opts.pop("dtype", jnp.bfloat16), opts.pop("kv_heads", 2)
    args = [
        Spec((2, t, 8, h), dtype),
        Spec((2, s, kv_heads, h), dtype),
        Spec((2, s, kv_heads, h), dtype),
    ]
    if opts.pop("segments", False):
        args += [Spec((2, t), jnp.int32), Spec((2, s), jnp.int32)]

    def loss(q, k, v, *segments):
        out = flash_attention(q, k, v, segment_ids=segments or None, **opts)
        return jnp.sum(out.astype(jnp.float32) ** 2)

    assert triton_calls(lower_for_gpu(loss, *args)) == 1
    grads = lower_for_gpu(jax.grad(loss, argnums=(0, 1, 2)), *args)
    assert triton_calls(grads) == 3  # forward, dQ, dK/dV
    assert "tpu_custom_call" not in grads.as_text()


def test_model_attention_impl_pallas_runs_the_triton_kernels_on_a_gpu():
    cfg = TransformerConfig(
        vocab_size=97,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        d_ff=128,
        max_seq_len=64,
        dtype="bfloat16",
        attention_impl="pallas",
    )
    params = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    tokens = Spec((2, 64), jnp.int32)
    lowered = lower_for_gpu(lambda p, x: forward(p, cfg, x), params, tokens)
    assert triton_calls(lowered) >= 1


def test_cpu_default_stays_the_interpreted_mosaic_kernel():
    q = jnp.zeros((1, 16, 2, 16))
    jaxpr = str(jax.make_jaxpr(lambda q: flash_attention(q, q, q))(q))
    assert "flash_attention_fwd" in jaxpr and "triton" not in jaxpr


PAGED_OPTIONS = [
    dict(),
    dict(sliding_window=20),
    dict(logits_soft_cap=2.0, sliding_window=3),
]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("options", PAGED_OPTIONS, ids=["full", "window", "cap_short_window"])
def test_paged_decode_matches_the_gathered_reference(options, dtype):
    """Pages scattered through a random permutation, GQA (4 over 2 heads), head_dim 24
    (padded inside), a sequence longer than two pages, a short one and an empty slot."""
    rng = np.random.default_rng(1)
    b, n, kv_heads, h, page_size, max_pages, num_pages = 3, 4, 2, 24, 16, 3, 11
    q = jnp.asarray(rng.standard_normal((b, n, h)), dtype)
    k_pages, v_pages = (
        jnp.asarray(rng.standard_normal((num_pages, page_size, kv_heads, h)), dtype)
        for _ in range(2)
    )
    table = jnp.asarray(rng.permutation(num_pages)[: b * max_pages].reshape(b, max_pages))
    lengths = jnp.asarray([40, 7, 0], jnp.int32)
    args = (q, k_pages, v_pages, table, lengths)
    got = paged_attention_triton(*args, interpret=True, **options)
    want = paged_attention_reference(*args, **options)
    tol = 1e-5 if dtype == jnp.float32 else 1e-2  # bf16: one or two ulps of the output
    assert got.shape == q.shape and got.dtype == dtype
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol
    )
    np.testing.assert_array_equal(np.asarray(got[2], np.float32), 0.0)


def test_paged_decode_lowers_to_triton_and_refuses_small_pages():
    lowered = lower_for_gpu(
        functools.partial(paged_attention_triton, sliding_window=100, logits_soft_cap=30.0),
        Spec((8, 32, 128), jnp.bfloat16),
        Spec((512, 16, 8, 128), jnp.bfloat16),
        Spec((512, 16, 8, 128), jnp.bfloat16),
        Spec((8, 64), jnp.int32),
        Spec((8,), jnp.int32),
    )
    assert triton_calls(lowered) == 1
    pages = jnp.zeros((4, 8, 1, 16))
    with pytest.raises(ValueError, match="power of two >= 16 tokens; got 8"):
        paged_attention_triton(
            jnp.zeros((1, 2, 16)),
            pages,
            pages,
            jnp.zeros((1, 2), jnp.int32),
            jnp.ones((1,), jnp.int32),
            interpret=True,
        )
