"""FP8 matmuls with per-tile scaling (``models.fp8``) against a slow numpy/ml_dtypes reference."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.models import TransformerConfig, fp8, hidden_states, init_params
from agentic_jax.models.transformer import _dense

# Half a step of each format, relative (normal numbers: 3 and 2 mantissa bits) and absolute in
# the scaled domain (half the smallest subnormal: 2^-9 / 2 for e4m3, 2^-16 / 2 for e5m2).
HALF_STEP = {fp8.E4M3: (2.0**-4, 2.0**-10), fp8.E5M2: (2.0**-3, 2.0**-17)}
NP_DTYPE = {fp8.E4M3: ml_dtypes.float8_e4m3fn, fp8.E5M2: ml_dtypes.float8_e5m2}


def _reference(x, dtype, tile):
    """Tile by tile in numpy: ``(dequantised x, per-tile scales)``."""
    fmax = float(ml_dtypes.finfo(NP_DTYPE[dtype]).max)
    rows, cols = x.shape
    out = np.zeros_like(x)
    scales = np.ones((-(-rows // tile[0]), -(-cols // tile[1])), np.float32)
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            sl = np.s_[i * tile[0] : (i + 1) * tile[0], j * tile[1] : (j + 1) * tile[1]]
            amax = np.abs(x[sl]).max()
            s = np.float32(fmax / amax) if amax > 0 else np.float32(1.0)
            q = np.clip(x[sl] * s, -fmax, fmax).astype(NP_DTYPE[dtype])
            out[sl], scales[i, j] = q.astype(np.float32) / s, s
    return out, scales


_round_trip = jax.jit(fp8.quantize, static_argnums=(1, 2))


def _matrix(seed, rows, cols, log_scale):
    """Random values whose magnitude varies over rows and columns by orders of magnitude."""
    rng = np.random.default_rng(seed)
    spread = 2.0 ** rng.uniform(-log_scale, log_scale, (rows, 1))
    return (rng.standard_normal((rows, cols)) * spread).astype(np.float32)


@given(
    seed=st.integers(0, 1000),
    rows=st.integers(1, 260),
    cols=st.integers(1, 300),
    log_scale=st.floats(0, 12),
    dtype=st.sampled_from([fp8.E4M3, fp8.E5M2]),
    tile=st.sampled_from([fp8.ACTIVATION_TILE, fp8.WEIGHT_TILE, (128, 1)]),
)
def test_quantize_rounds_each_tile_within_half_a_step_of_its_scale(
    seed, rows, cols, log_scale, dtype, tile
):
    x = _matrix(seed, rows, cols, log_scale)
    q, scale = _round_trip(jnp.asarray(x), dtype, tile)
    back = np.asarray(fp8.dequantize(q, scale, tile))
    ref_back, ref_scale = _reference(x, dtype, tile)
    np.testing.assert_allclose(np.asarray(scale), ref_scale, rtol=1e-6)
    np.testing.assert_allclose(back, ref_back, rtol=1e-6, atol=0)
    rel, absolute = HALF_STEP[dtype]
    s = np.asarray(fp8._expand(scale, tile, x.shape))
    assert np.all(np.abs(back - x) <= rel * np.abs(x) + absolute / s + 1e-30)
    assert np.isfinite(back).all()


def test_an_all_zero_tile_gives_zeros_with_scale_one_and_no_nan():
    x = jnp.zeros((3, 300)).at[0, :128].set(jnp.linspace(-2.0, 2.0, 128))
    q, scale = fp8.quantize(x, fp8.E4M3)
    back = fp8.dequantize(q, scale)
    assert np.all(np.asarray(back)[1:] == 0) and np.all(np.asarray(back)[0, 128:] == 0)
    assert np.all(np.asarray(scale)[1:] == 1.0) and np.asarray(scale)[0, 0] == 448.0 / 2.0
    w = jnp.zeros((300, 5))
    y, grads = jax.jit(jax.value_and_grad(lambda x, w: fp8.fp8_matmul(x, w).sum(), (0, 1)))(x, w)
    assert float(y) == 0 and all(np.isfinite(np.asarray(g)).all() for g in grads)


@pytest.mark.parametrize("tile", [fp8.ACTIVATION_TILE, fp8.WEIGHT_TILE])
def test_an_outlier_changes_only_its_own_tiles_scale_and_error(tile):
    x = _matrix(0, 200, 300, 2.0)
    spiked = x.copy()
    spiked[130, 140] = 1e4  # in tile (130 // tr, 1)
    q0, s0 = fp8.quantize(jnp.asarray(x), fp8.E4M3, tile)
    q1, s1 = fp8.quantize(jnp.asarray(spiked), fp8.E4M3, tile)
    hit = (130 // tile[0], 1)
    other = np.ones(s0.shape, bool)
    other[hit] = False
    np.testing.assert_array_equal(np.asarray(s0)[other], np.asarray(s1)[other])
    assert float(s1[hit]) < float(s0[hit]) / 100
    in_tile = np.asarray(fp8._expand(jnp.asarray(~other, jnp.float32), tile, x.shape)) > 0
    d0, d1 = np.asarray(fp8.dequantize(q0, s0, tile)), np.asarray(fp8.dequantize(q1, s1, tile))
    np.testing.assert_array_equal(d0[~in_tile], d1[~in_tile])


def test_delayed_scaling_scales_by_the_history_and_forgets_after_its_length():
    history = fp8.AmaxHistory.create(3, (2, 1))
    x = jnp.ones((2, 64))
    _, scale, history = fp8.quantize_delayed(x, fp8.E4M3, history)
    np.testing.assert_allclose(scale, 448.0)  # empty history: the current amax
    _, scale, history = fp8.quantize_delayed(x * 8, fp8.E4M3, history)
    np.testing.assert_allclose(scale, 448.0)  # scaled by step 1's amax: 8 saturates to 448
    q, scale, history = fp8.quantize_delayed(x, fp8.E4M3, history)
    np.testing.assert_allclose(scale, 448.0 / 8)  # the history's max
    for _ in range(2):
        _, scale, history = fp8.quantize_delayed(x, fp8.E4M3, history)
    np.testing.assert_allclose(scale, 448.0 / 8)  # step 2 is still among the last 3
    _, scale, _ = fp8.quantize_delayed(x, fp8.E4M3, history)
    np.testing.assert_allclose(scale, 448.0)  # and now it is not
    q, scale, _ = fp8.quantize_delayed(x * 1e6, fp8.E4M3, history)
    assert np.all(np.asarray(fp8.dequantize(q, scale)) == 1.0)  # saturates, no NaN
    with pytest.raises(ValueError, match="tile grid"):
        fp8.quantize_delayed(jnp.ones((3, 64)), fp8.E4M3, history)


def test_the_fp8_dot_path_equals_the_dequantised_one():
    x, w = _matrix(1, 40, 300, 3.0), _matrix(2, 300, 70, 1.0)
    a = fp8._product(jnp.asarray(x), fp8.E4M3, jnp.asarray(w), fp8.E4M3, fp8.WEIGHT_TILE, True)
    b = fp8._product(jnp.asarray(x), fp8.E4M3, jnp.asarray(w), fp8.E4M3, fp8.WEIGHT_TILE, False)
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-5 * float(jnp.abs(b).max()))


def _rel(a, b):
    return float(jnp.linalg.norm(jnp.ravel(a - b)) / jnp.linalg.norm(jnp.ravel(b)))


@pytest.mark.parametrize(
    "eq, x_shape, w_shape",
    [("btd,dnh->btnh", (2, 5, 200), (200, 3, 50)), ("btnh,nhd->btd", (2, 5, 3, 50), (3, 50, 70))],
)
def test_fp8_dense_forward_and_gradients_are_close_to_float32(eq, x_shape, w_shape):
    """Tolerances (relative Frobenius error): 4% forward (e4m3 operands: 2^-4 per element at
    worst, averaging down over the contraction), 10% for the gradients (e5m2: 2^-3)."""
    x = jax.random.normal(jax.random.key(0), x_shape)
    w = jax.random.normal(jax.random.key(1), w_shape) / np.sqrt(
        np.prod(w_shape[: len(x_shape) - 2])
    )
    cot = jax.random.normal(jax.random.key(2), jnp.einsum(eq, x, w).shape)

    def loss(x, w, precision):
        return jnp.sum(_dense(eq, x, w, "q", {}, None, precision=precision) * cot)

    forward = jax.jit(
        lambda x, w, p: _dense(eq, x, w, "q", {}, None, precision=p), static_argnums=2
    )
    grad = jax.jit(jax.grad(loss, (0, 1)), static_argnums=2)
    y8, y = forward(x, w, "fp8"), forward(x, w, "default")
    g8, g = grad(x, w, "fp8"), grad(x, w, "default")
    assert 0 < _rel(y8, y) < 0.04
    for a, b in zip(g8, g):
        assert a.shape == b.shape and 0 < _rel(a, b) < 0.10


def test_the_backward_pass_quantises_the_gradient_to_e5m2_per_tile():
    x, w = _matrix(3, 6, 200, 1.0), _matrix(4, 200, 150, 1.0)
    g = _matrix(5, 6, 150, 4.0)
    backward = jax.jit(lambda x, w, g: jax.vjp(fp8.fp8_matmul, x, w)[1](g))
    dx, dw = backward(jnp.asarray(x), jnp.asarray(w), jnp.asarray(g))
    g_dx, _ = _reference(g, fp8.E5M2, (1, 128))
    w_t, _ = _reference(w.T.copy(), fp8.E4M3, (128, 128))
    x_t, _ = _reference(x.T.copy(), fp8.E4M3, (1, 128))
    g_dw, _ = _reference(g, fp8.E5M2, (128, 1))
    np.testing.assert_allclose(dx, g_dx @ w_t, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, x_t @ g_dw, rtol=1e-4, atol=1e-4)
    assert _rel(dx, jnp.asarray(g @ w.T)) > 1e-3  # the quantisation is really there


def test_an_fp8_model_runs_every_dense_projection_in_fp8_and_stays_close():
    config = TransformerConfig(
        vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64
    )
    params = init_params(config, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 8), 0, 64)
    run = jax.jit(hidden_states, static_argnums=1)
    h, h8 = run(params, config, tokens), run(params, config.replace(matmul_precision="fp8"), tokens)
    assert 0 < _rel(h8, h) < 0.05


def test_bad_fp8_configurations_are_refused():
    with pytest.raises(ValueError, match="mixture-of-experts"):
        TransformerConfig(n_experts=4, matmul_precision="fp8")
    with pytest.raises(ValueError, match="matmul_precision"):
        TransformerConfig(matmul_precision="fp4")
    with pytest.raises(ValueError, match="projection"):
        fp8.fp8_einsum("bd,bd->b", jnp.ones((2, 3)), jnp.ones((2, 3)))
    with pytest.raises(ValueError, match="float8"):
        fp8.quantize(jnp.ones((2, 3)), jnp.bfloat16)
