"""Optimiser, schedules, loss and the train step."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.models import TransformerConfig, init_params, param_shapes
from agentic_jax.training import (
    TrainState,
    cross_entropy,
    make_optimizer,
    make_schedule,
    make_train_step,
    make_update,
    weight_decay_mask,
)
from agentic_jax.training.loop import train
from agentic_jax.training.mfu import peak_flops_per_device

PEAK, TOTAL, WARM = 1e-3, 100, 10


@pytest.mark.parametrize("kind", ["constant", "cosine", "linear", "wsd"])
def test_schedules_warm_up_linearly_then_follow_their_shape(kind):
    f = make_schedule(
        PEAK, TOTAL, kind=kind, warmup_steps=WARM, final_lr_ratio=0.1, decay_fraction=0.2
    )
    lr = np.array([float(f(s)) for s in range(TOTAL + 1)])
    np.testing.assert_allclose(lr[: WARM + 1], np.linspace(0, PEAK, WARM + 1), rtol=1e-5, atol=1e-9)
    after = lr[WARM:]
    if kind == "constant":
        np.testing.assert_allclose(after, PEAK, rtol=1e-6)
        return
    assert np.all(np.diff(after) <= 1e-9), "never increases after warmup"
    np.testing.assert_allclose(lr[TOTAL], 0.1 * PEAK, rtol=1e-4)
    if kind == "cosine":  # half-way through the decay: the midpoint between peak and final
        np.testing.assert_allclose(lr[WARM + (TOTAL - WARM) // 2], 0.55 * PEAK, rtol=1e-3)
    if kind == "linear":
        np.testing.assert_allclose(np.diff(after), (0.1 * PEAK - PEAK) / (TOTAL - WARM), rtol=1e-3)
    if kind == "wsd":  # stable until the last 20% of training
        np.testing.assert_allclose(lr[WARM : TOTAL - 20 + 1], PEAK, rtol=1e-6)
        assert lr[TOTAL - 10] < PEAK


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(["cosine", "linear", "wsd"]),
    total=st.integers(2, 300),
    warmup_share=st.floats(0.0, 0.99),
    decay_fraction=st.floats(0.01, 1.0),
)
def test_every_decaying_schedule_ends_at_the_final_lr(kind, total, warmup_share, decay_fraction):
    """Whatever share of the run the warmup takes (even into WSD's decay window), the rate peaks
    when it ends, never rises afterwards and reaches ``final_lr_ratio * peak`` at ``total``."""
    warmup = int(warmup_share * total)
    f = make_schedule(
        PEAK,
        total,
        kind=kind,
        warmup_steps=warmup,
        final_lr_ratio=0.1,
        decay_fraction=decay_fraction,
    )
    # One shape for every example (steps past ``total`` repeat it), so eager ops reuse their
    # compilations.
    lr = np.asarray(f(jnp.minimum(jnp.arange(301), total)))[: total + 1]
    np.testing.assert_allclose(lr[warmup], PEAK, rtol=1e-5)
    assert np.all(np.diff(lr[warmup:]) <= 1e-9)
    np.testing.assert_allclose(lr[total], 0.1 * PEAK, rtol=1e-4)


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="kind"):
        make_schedule(kind="step")
    with pytest.raises(ValueError, match="warmup_steps"):
        make_schedule(total_steps=10, warmup_steps=20)
    with pytest.raises(ValueError, match="decay_fraction"):
        make_schedule(kind="wsd", decay_fraction=1.5)


@pytest.mark.parametrize(
    "device_kind, tflops",
    [
        ("TPU v5", 459),
        ("TPU v5p", 459),
        ("TPU v5 lite", 197),
        ("TPU v6 lite", 918),
        ("TPU v4", 275),
        ("NVIDIA L4", 121),
        ("NVIDIA L40S", 362),
        ("NVIDIA H100 80GB HBM3", 989),
        ("NVIDIA A100-SXM4-80GB", 312),
    ],
)
def test_peak_flops_follow_the_data_sheet_of_each_device_kind(device_kind, tflops):
    """JAX names a v5p chip "TPU v5" (a v5e one "TPU v5 lite"); an L40S is no L4."""
    device = type("Device", (), {"device_kind": device_kind})()
    assert peak_flops_per_device(device) == tflops * 1e12


CFG = TransformerConfig(
    vocab_size=61,
    d_model=16,
    n_layers=2,
    n_heads=2,
    n_kv_heads=1,
    head_dim=8,
    d_ff=24,
    tie_embeddings=False,
    qkv_bias=True,
)


_init = jax.jit(init_params, static_argnums=0)


def test_weight_decay_mask_excludes_norms_biases_and_embeddings():
    mask = weight_decay_mask(param_shapes(CFG))
    flat = {
        jax.tree_util.keystr(p, simple=True, separator="/"): v
        for p, v in jax.tree_util.tree_leaves_with_path(mask)
    }
    excluded = {k for k, v in flat.items() if not v}
    assert excluded == {
        "embed",
        "final_norm",
        "layers/attn_norm",
        "layers/mlp_norm",
        "layers/attn/q_bias",
        "layers/attn/k_bias",
        "layers/attn/v_bias",
    }
    assert flat["lm_head"] and flat["layers/mlp/down"] and flat["layers/attn/q"]


def test_weight_decay_touches_only_masked_params():
    params = _init(CFG, jax.random.key(0))
    opt = make_optimizer(lambda _: 1e-2, weight_decay=0.5, clip_norm=None)
    zero = jax.tree.map(jnp.zeros_like, params)
    # zero gradient: only the decay moves parameters
    updates, _ = jax.jit(opt.update)(zero, opt.init(params), params)
    mask = weight_decay_mask(params)
    for u, m in zip(jax.tree.leaves(updates), jax.tree.leaves(mask)):
        assert bool(jnp.any(u != 0)) == m


_ce = jax.jit(lambda logits, targets, mask, z: cross_entropy(logits, targets, mask, z_loss=z))


@given(st.integers(0, 2**16), st.floats(0.0, 1e-2))
def test_cross_entropy_matches_optax_with_mask_and_z_loss(seed, z):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    logits = 3 * jax.random.normal(k1, (3, 7, 11))
    targets = jax.random.randint(k2, (3, 7), 0, 11)
    mask = jax.random.bernoulli(k3, 0.7, (3, 7))
    total, count, m = _ce(logits, targets, mask, z)
    ref = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    log_z = jax.nn.logsumexp(logits, -1)
    np.testing.assert_allclose(m["nll"], jnp.sum(ref * mask), rtol=1e-5)
    np.testing.assert_allclose(total, jnp.sum((ref + z * log_z**2) * mask), rtol=1e-5)
    assert count == mask.sum()


def _batch(seed, rows=4, t=8):
    tok = jax.random.randint(jax.random.key(seed), (rows, t + 1), 0, CFG.vocab_size)
    seg = jnp.ones((rows, t), jnp.int32).at[0, 5:].set(2)
    return {
        "tokens": tok[:, :-1],
        "targets": tok[:, 1:],
        "segment_ids": seg,
        "positions": jnp.broadcast_to(jnp.arange(t), (rows, t)),
        "loss_mask": jnp.ones((rows, t), jnp.int32).at[1, :3].set(0),
    }


def test_gradient_accumulation_gives_the_same_update():
    sched = make_schedule(1e-2, 10, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched)
    state = TrainState.create(_init(CFG, jax.random.key(1)), opt, seed=0)
    batch = _batch(2)
    whole, m1 = jax.jit(make_train_step(CFG, opt, sched, accum_steps=1))(state, batch)
    split, m2 = jax.jit(make_train_step(CFG, opt, sched, accum_steps=2))(state, batch)
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(whole.params), jax.tree.leaves(split.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)  # Adam amplifies rounding
    assert int(whole.step) == 1
    with pytest.raises(ValueError, match="accum_steps=3"):
        make_train_step(CFG, opt, sched, accum_steps=3)(state, batch)


def test_train_steps_reduce_loss_on_a_fixed_batch():
    sched = make_schedule(1e-2, 30, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched)
    state = TrainState.create(_init(CFG, jax.random.key(3)), opt, seed=0)
    step = jax.jit(make_train_step(CFG, opt, sched))
    batch = _batch(4)
    losses = []
    for _ in range(30):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.5 * losses[0]


def test_fused_cross_entropy_step_equals_the_materialised_one():
    sched = make_schedule(1e-2, 10, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched)
    state = TrainState.create(_init(CFG, jax.random.key(5)), opt, seed=0)
    batch = _batch(6)
    plain, m1 = jax.jit(make_train_step(CFG, opt, sched))(state, batch)
    fused, m2 = jax.jit(make_train_step(CFG, opt, sched, fused_cross_entropy=True))(state, batch)
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-6)
    np.testing.assert_allclose(m1["grad_norm"], m2["grad_norm"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(plain.params), jax.tree.leaves(fused.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="z_loss"):
        make_train_step(CFG, opt, sched, z_loss=1e-4, fused_cross_entropy=True)(state, batch)
    capped = CFG.replace(final_logit_softcap=30.0)
    with pytest.raises(ValueError, match="final_logit_softcap"):
        make_train_step(capped, opt, sched, fused_cross_entropy=True)(state, batch)


def test_a_batch_that_does_not_split_over_the_processes_is_refused(tmp_path, monkeypatch):
    # Each process loads batch_size // process_count rows: 16 over 3 would silently train on 15.
    monkeypatch.setattr(jax, "process_count", lambda: 3)
    with pytest.raises(ValueError, match="batch_size=16 must divide by the 3 processes"):
        train(str(tmp_path), batch_size=16)


def _metric_loss(params, batch, key):
    """A loss whose metrics exercise every reduction: a sum, a max and a min over rows."""
    del key
    x = batch["x"] @ params["w"]
    rows = jnp.float32(x.shape[0])
    return jnp.sum(x), rows, {"x_sum": jnp.sum(x), "x_max": jnp.max(x), "x_min": jnp.min(x)}


@settings(max_examples=20, deadline=None)
@given(
    st.sampled_from([1, 2, 4, 8]),
    st.lists(st.floats(-100, 100, allow_nan=False), min_size=24, max_size=24),
)
def test_make_update_reduces_sums_maxima_and_minima_exactly_over_micro_batches(accum, values):
    """Micro-batch metrics reduce as what they are: a ``*_max`` metric is the max over the whole
    batch, not the sum of the micro-batches' maxima."""
    x = np.asarray(values, np.float32).reshape(8, 3)
    params = {"w": jnp.asarray([1.0, -2.0, 0.5])}
    optimizer = optax.sgd(0.1)
    update = jax.jit(make_update(_metric_loss, optimizer, accum_steps=accum))
    state, metrics = update(TrainState.create(params, optimizer, 0), None, {"x": jnp.asarray(x)})
    rows = x @ np.asarray([1.0, -2.0, 0.5], np.float32)
    np.testing.assert_allclose(metrics["x_max"], rows.max(), rtol=1e-6)
    np.testing.assert_allclose(metrics["x_min"], rows.min(), rtol=1e-6)
    np.testing.assert_allclose(metrics["x_sum"], rows.sum(), rtol=1e-5, atol=1e-3)
    np.testing.assert_allclose(metrics["loss"], rows.mean(), rtol=1e-5, atol=1e-4)
    assert metrics["count"] == 8
    # The gradient of the mean is the column mean of x, whatever the split.
    np.testing.assert_allclose(
        state.params["w"], params["w"] - 0.1 * x.mean(axis=0), rtol=1e-5, atol=1e-5
    )
