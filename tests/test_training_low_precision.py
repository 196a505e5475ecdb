"""Low-precision training: float16's dynamic loss scaling in ``make_update``, and FP8 matmuls
against float32 on the shipped corpus."""

import gzip

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentic_jax.data.corpus import corpus_files
from agentic_jax.models import TransformerConfig, init_params
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from agentic_jax.training.loss_scale import DynamicLossScale
from agentic_jax.training.update import make_update


def _linear_loss(params, batch, key):
    del key
    total = jnp.sum(params["w"] * batch["x"]) + 0.5 * jnp.sum(params["w"] ** 2)
    return total, jnp.float32(batch["x"].shape[0]), {}


def _expected_scales(bad, steps, init, interval):
    """The scale each step uses, by the rule written out: halve on a bad step, double after
    ``interval`` good steps in a row."""
    scales, scale, good = [], init, 0
    for step in range(steps):
        scales.append(scale)
        if step in bad:
            scale, good = max(scale / 2, 1.0), 0
        else:
            good += 1
            if good == interval:
                scale, good = scale * 2, 0
    return scales


def test_loss_scaling_skips_exactly_the_overflowing_steps_and_halves_and_doubles_the_scale():
    bad, steps = {2, 3, 7}, 10
    loss_scale = DynamicLossScale(init_scale=8.0, growth_interval=2)
    opt = optax.adam(0.1)
    update = jax.jit(make_update(_linear_loss, opt, loss_scale=loss_scale))
    plain = jax.jit(make_update(_linear_loss, opt))
    state = TrainState.create({"w": jnp.arange(4.0)}, opt, seed=0, loss_scale=loss_scale)
    rng = np.random.default_rng(0)
    scales = []
    for step in range(steps):
        x = rng.standard_normal((2, 4)).astype(np.float32)
        if step in bad:
            x[1, step % 4] = np.inf
        new, metrics = update(state, None, {"x": jnp.asarray(x)})
        scales.append(float(metrics["loss_scale"]))
        assert int(metrics["skipped"]) == (step in bad)
        if step in bad:
            for a, b in zip(
                jax.tree.leaves((new.params, new.opt_state)),
                jax.tree.leaves((state.params, state.opt_state)),
            ):
                np.testing.assert_array_equal(a, b)
        else:  # the unscaled update, exactly (the scales are powers of two)
            reference, _ = plain(state.replace(loss_scale=None), None, {"x": jnp.asarray(x)})
            assert not np.array_equal(new.params["w"], state.params["w"])
            np.testing.assert_array_equal(new.params["w"], reference.params["w"])
        assert int(new.step) == step + 1
        state = new
    assert scales == _expected_scales(bad, steps, 8.0, 2)
    assert max(scales) > 8.0 and min(scales) < 8.0  # it both grew and shrank


def test_loss_scaling_refuses_a_state_without_a_scale_and_bad_settings():
    opt = optax.sgd(0.1)
    update = make_update(_linear_loss, opt, loss_scale=DynamicLossScale())
    with pytest.raises(ValueError, match=r"TrainState\.create"):
        update(TrainState.create({"w": jnp.ones(2)}, opt, 0), None, {"x": jnp.ones((1, 2))})
    with pytest.raises(ValueError, match="growth_interval"):
        DynamicLossScale(growth_interval=0)
    with pytest.raises(ValueError, match="init_scale"):
        DynamicLossScale(init_scale=0.5)


TINY = dict(vocab_size=256, d_model=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, d_ff=64)


def _corpus_batches(steps, rows=8, seq=32):
    """Byte-level batches of the shipped training corpus (token = UTF-8 byte)."""
    with gzip.open(corpus_files("train")[0], "rb") as f:
        data = np.frombuffer(f.read(steps * rows * (seq + 1)), np.uint8).astype(np.int32)
    windows = data.reshape(steps, rows, seq + 1)
    for w in windows:
        yield {
            "tokens": jnp.asarray(w[:, :-1]),
            "targets": jnp.asarray(w[:, 1:]),
            "segment_ids": jnp.ones((rows, seq), jnp.int32),
            "positions": jnp.broadcast_to(jnp.arange(seq), (rows, seq)),
            "loss_mask": jnp.ones((rows, seq), jnp.int32),
        }


def _losses(config, steps, loss_scale=None):
    schedule = make_schedule(3e-3, steps, kind="constant", warmup_steps=0)
    opt = make_optimizer(schedule)
    state = TrainState.create(init_params(config, jax.random.key(0)), opt, 0, loss_scale)
    step = jax.jit(make_train_step(config, opt, schedule, loss_scale=loss_scale))
    out = []
    for batch in _corpus_batches(steps):
        state, metrics = step(state, batch)
        out.append({k: float(v) for k, v in metrics.items()})
    return out


def test_fp8_training_follows_the_float32_loss_curve_on_the_corpus():
    """20 steps of a 2-layer, d=32 byte-level model: the FP8 run's loss stays within 0.02 nats
    of float32's at every step (measured: 0.008; it falls by 2 nats meanwhile)."""
    steps = 20
    f32 = [m["loss"] for m in _losses(TransformerConfig(**TINY), steps)]
    f8 = [m["loss"] for m in _losses(TransformerConfig(**TINY, matmul_precision="fp8"), steps)]
    assert f32[0] - f32[-1] > 1.0
    np.testing.assert_allclose(f8, f32, atol=0.02)
    assert f8 != f32  # the FP8 path really ran


def test_float16_training_with_a_too_large_scale_skips_then_settles():
    """Started at 2^16 the scaled float16 backward overflows: those steps are skipped, each
    halving the scale, until it fits; the model then trains at a scale near the largest that
    fits, where an overflow now and then halves it again (the loss is a sum over the batch's
    tokens, so its gradients grow with training and the scale that fits shrinks)."""
    config = TransformerConfig(**TINY, dtype="float16")
    runs = _losses(config, 20, DynamicLossScale(init_scale=2.0**16, growth_interval=1000))
    skipped = [m["skipped"] for m in runs]
    scales = [m["loss_scale"] for m in runs]
    assert skipped[:3] == [1, 1, 1] and sum(skipped) <= 10  # measured: the first 7
    for i in range(19):
        assert scales[i + 1] == scales[i] / (2 if skipped[i] else 1)
    assert all(np.isfinite(m["loss"]) for m in runs)
    assert runs[-1]["loss"] < runs[0]["loss"] - 0.5  # measured: 5.44 -> 4.01


def test_the_shipped_low_precision_configs_bind_what_they_say():
    import gin

    import agentic_jax.registry  # noqa: F401  (the configurables the files name)
    from agentic_jax import config as gin_config

    try:
        gin_config.parse(["pretrain_fp8"], [])
        assert TransformerConfig().matmul_precision == "fp8"
        assert TransformerConfig().d_model == 128  # the pretrain model
        gin_config.parse(["pretrain_fp16"], [])
        assert TransformerConfig().compute_dtype == jnp.float16
        assert gin.query_parameter("train.loss_scale").selector == "DynamicLossScale"
        assert DynamicLossScale() == DynamicLossScale(init_scale=2.0**15, growth_interval=2000)
    finally:
        gin.clear_config()
