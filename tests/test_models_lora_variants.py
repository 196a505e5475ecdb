"""DoRA, LoRA+ and QLoRA: exact starts, forward = merged weights, learning-rate ratio, SFT runs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_models_lora import UNTIED as CFG
from tiny_models import task_model_dir

from agentic_jax.envs.text import Arithmetic
from agentic_jax.models import forward, init_params
from agentic_jax.models.export import load_checkpoint
from agentic_jax.models.lora import (
    PROJECTIONS,
    LoRA,
    LoraConfig,
    load_adapters,
    lora_axes,
    lora_plus,
    save_adapters,
)
from agentic_jax.models.quantization import is_quantized
from agentic_jax.post_training.sft import train_sft
from agentic_jax.post_training.tasks import TaskSpec
from agentic_jax.training import make_update
from agentic_jax.training.metrics import read_metrics
from agentic_jax.training.state import TrainState

TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 10)), jnp.int32)
DORA = LoraConfig(rank=3, alpha=6.0, variant="dora")
_forward = jax.jit(forward, static_argnums=1)


def _key(seed):
    return jax.random.key(seed, impl="rbg")


@pytest.fixture(scope="module")
def base():
    return jax.jit(init_params, static_argnums=0)(CFG, _key(0))


def _random_adapters(lora, base, seed, std=0.5):
    """Adapters with nonzero A and B, and DoRA magnitudes off ``||W||_c`` (numpy draws)."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lora.init, base, _key(0))
    return jax.tree_util.tree_map_with_path(
        lambda path, s: jnp.asarray(
            rng.uniform(0.5, 2.0, s.shape) if path[-1].key == "m" else rng.normal(0, std, s.shape),
            s.dtype,
        ),
        shapes,
    )


def _numpy_dora_weight(w, a, b, m, scale, n_in):
    """``m · V / ||V||_c`` with ``V = W + scale · A B``, one layer, float64."""
    in_shape = w.shape[:n_in]
    v = w + scale * (a.reshape(-1, a.shape[-1]) @ b.reshape(b.shape[0], -1)).reshape(w.shape)
    norm = np.sqrt((v.reshape(int(np.prod(in_shape)), -1) ** 2).sum(0)).reshape(m.shape)
    return v * (m / norm)


def test_dora_with_b_zero_is_the_base(base):
    """Magnitudes start at ``||W||_c`` (checked by numpy) and, with the direction unchanged
    (B = 0), the adapted model gives the base's logits."""
    lora = LoRA(DORA)
    adapters = lora.init(base, _key(1))
    w = np.asarray(base["layers"]["attn"]["o"], np.float64)  # [L, N, H, D]: two input dims
    np.testing.assert_allclose(adapters["o"]["m"], np.sqrt((w**2).sum(axis=(1, 2))), rtol=1e-6)
    np.testing.assert_allclose(
        _forward(lora.model_params(adapters, base), CFG, TOKENS),
        _forward(base, CFG, TOKENS),
        rtol=1e-5,
        atol=1e-6,
    )
    merged = lora.merged(adapters, base)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7), merged, base)


@settings(max_examples=5, deadline=None)
@given(
    targets=st.sets(st.sampled_from(tuple(PROJECTIONS)), min_size=1),
    seed=st.integers(0, 100),
)
def test_dora_forward_equals_merged_weights(base, targets, seed):
    lora = LoRA(LoraConfig(rank=2, alpha=3.0, targets=tuple(sorted(targets)), variant="dora"))
    adapters = _random_adapters(lora, base, seed)
    adapted = forward(lora.model_params(adapters, base), CFG, TOKENS)
    np.testing.assert_allclose(
        forward(lora.merged(adapters, base), CFG, TOKENS), adapted, atol=2e-5
    )
    assert np.abs(forward(base, CFG, TOKENS) - adapted).max() > 1e-3


def test_dora_merge_equals_numpy(base):
    lora = LoRA(LoraConfig(rank=3, alpha=6.0, targets=("o", "up"), variant="dora"))
    adapters = _random_adapters(lora, base, 4)
    merged = lora.merged(adapters, base)
    for name in ("o", "up"):
        group, n_in = PROJECTIONS[name]
        w, (a, b, m) = (
            np.asarray(base["layers"][group][name], np.float64),
            (np.asarray(adapters[name][p], np.float64) for p in "abm"),
        )
        want = np.stack([_numpy_dora_weight(w[i], a[i], b[i], m[i], 2.0, n_in) for i in range(2)])
        np.testing.assert_allclose(merged["layers"][group][name], want, rtol=1e-5, atol=1e-6)


def test_dora_gradients_treat_the_norm_as_a_constant(base):
    """The block's gradients equal those of ``x · m V / stop_gradient(||V||_c)`` with the
    weight built by hand, and every adapter part (A, B and m) gets one."""
    lora = LoRA(LoraConfig(rank=2, alpha=2.0, targets=("v", "down"), variant="dora"))
    adapters = _random_adapters(lora, base, 7)
    probe = jnp.asarray(np.random.default_rng(2).normal(size=(2, 10, CFG.vocab_size)), jnp.float32)

    def by_block(t):
        return jnp.sum(forward(lora.model_params(t, base), CFG, TOKENS) * probe)

    def by_weights(t):
        layers = dict(base["layers"])
        for name, ad in t.items():
            group, n_in = PROJECTIONS[name]
            w = layers[group][name]
            r = ad["a"].shape[-1]
            v = w + lora.config.scale * jnp.matmul(
                ad["a"].reshape(2, -1, r), ad["b"].reshape(2, r, -1)
            ).reshape(w.shape)
            norm = jnp.sqrt(jnp.sum(v**2, axis=tuple(range(1, 1 + n_in)), keepdims=True))
            layers[group] = {
                **layers[group],
                name: v * ad["m"][:, None] / jax.lax.stop_gradient(norm),
            }
        return jnp.sum(forward({**base, "layers": layers}, CFG, TOKENS) * probe)

    got, want = (jax.jit(jax.grad(f))(adapters) for f in (by_block, by_weights))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-4, atol=1e-5), got, want)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(got))


def test_dora_axes_round_trip_and_no_unmerge(base, tmp_path):
    lora = LoRA(LoraConfig(rank=2, targets=("q", "o"), variant="dora", lora_plus_ratio=4.0))
    axes = lora_axes(CFG, lora.config)
    assert axes["q"]["m"] == ("layers", "q_heads", "head_dim")
    assert axes["o"]["m"] == ("layers", "embed")
    adapters = _random_adapters(lora, base, 3)
    assert jax.tree.map(jnp.shape, adapters)["o"]["m"] == (2, CFG.d_model)
    save_adapters(tmp_path / "ad", adapters, lora.config, "fp")
    loaded, config = load_adapters(tmp_path / "ad", base_fingerprint="fp")
    assert config == lora.config
    jax.tree.map(np.testing.assert_array_equal, loaded, adapters)
    plain = LoraConfig(rank=2, targets=("q", "o"))
    with pytest.raises(ValueError, match=r"variant='lora' needs \('a', 'b'\)"):
        save_adapters(tmp_path / "other", adapters, plain, "fp")
    with pytest.raises(ValueError, match=r"adapter '[qo]' has shapes .* variant 'lora'"):
        LoRA(plain).model_params(adapters, base)
    with pytest.raises(ValueError, match="DoRA merge cannot be undone"):
        lora.unmerge(lora.merged(adapters, base), adapters)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"variant": "vera"}, r"variant='vera'; expected one of \('lora', 'dora'\)"),
        ({"lora_plus_ratio": 0.0}, "lora_plus_ratio must be positive"),
    ],
)
def test_bad_variant_values_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoraConfig(**kwargs)


def test_lora_plus_scales_the_updates_of_b_only(base):
    """One AdamW step on a fixed gradient: with the ratio, B's updates are ``ratio`` times those
    without it; A's and m's are the same."""
    config = LoraConfig(rank=2, targets=("q", "up"), variant="dora")
    adapters = _random_adapters(LoRA(config), base, 5)
    grads = jax.tree.map(lambda x: jnp.cos(x) + 0.1, adapters)
    optimizer = optax.adamw(1e-2, weight_decay=0.1)
    plain, _ = optimizer.update(grads, optimizer.init(adapters), adapters)
    ratio = LoRA(LoraConfig(**{**config.__dict__, "lora_plus_ratio": 16.0}))
    scaled = ratio.scale_updates(plain)
    chained = optax.chain(optimizer, lora_plus(16.0))
    by_chain, _ = chained.update(grads, chained.init(adapters), adapters)
    for name in adapters:
        np.testing.assert_allclose(scaled[name]["b"], 16.0 * plain[name]["b"], rtol=1e-6)
        np.testing.assert_array_equal(scaled[name]["a"], plain[name]["a"])
        np.testing.assert_array_equal(scaled[name]["m"], plain[name]["m"])
        assert float(jnp.abs(plain[name]["b"]).max()) > 0
    jax.tree.map(np.testing.assert_array_equal, by_chain, scaled)
    assert LoRA(config).scale_updates(plain) is plain


def test_make_update_applies_the_lora_plus_ratio(base):
    """Through the trainers' update: after one SGD step from the same state, B moved ``ratio``
    times as far with LoRA+ as without."""
    tokens = jnp.tile(jnp.arange(10) % 5, (2, 1))

    def loss(params, batch, key):
        logits = forward(params, CFG, batch[:, :-1])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
        return ce.sum(), jnp.float32(ce.size), {}

    moved = {}
    for ratio in (1.0, 8.0):
        lora = LoRA(LoraConfig(rank=2, targets=("v",), lora_plus_ratio=ratio))
        adapters = _random_adapters(lora, base, 6)
        optimizer = optax.sgd(0.1)
        state = TrainState.create(adapters, optimizer, 0)
        new, _ = jax.jit(make_update(loss, optimizer, lora))(state, base, tokens)
        moved[ratio] = jax.tree.map(jnp.subtract, new.params, adapters)["v"]
    # ``new - old`` rounds at the scale of the adapters (~1): a few float32 ulps of that.
    np.testing.assert_allclose(moved[8.0]["b"], 8.0 * moved[1.0]["b"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(moved[8.0]["a"], moved[1.0]["a"], atol=1e-6)
    assert float(jnp.abs(moved[1.0]["b"]).max()) > 0


def test_qlora_zero_adapters_give_the_quantised_base(base):
    lora = LoRA(LoraConfig(rank=2, base_quantization="nf4"))
    frozen = lora.frozen(base)
    q = frozen["layers"]["attn"]["q"]
    assert is_quantized(q) and q.fmt == "nf4" and q.scales.dtype == jnp.float8_e4m3fn
    assert not is_quantized(frozen["embed"]) and not is_quantized(frozen["lm_head"])
    adapters = lora.init(base, _key(1))
    assert {x.dtype for x in jax.tree.leaves(adapters)} == {jnp.dtype(jnp.float32)}
    quantised = _forward(frozen, CFG, TOKENS)
    np.testing.assert_array_equal(
        _forward(lora.model_params(adapters, frozen), CFG, TOKENS), quantised
    )
    assert np.abs(quantised - _forward(base, CFG, TOKENS)).max() > 1e-4  # NF4 is not the base
    # DoRA over NF4: m starts at the dequantised weights' norms, so B = 0 is that base too.
    dora = LoRA(dataclasses.replace(lora.config, variant="dora"))
    np.testing.assert_allclose(
        _forward(dora.model_params(dora.init(base, _key(1)), frozen), CFG, TOKENS),
        quantised,
        rtol=1e-5,
        atol=1e-6,
    )
    with pytest.raises(ValueError, match=r"pass LoRA\.frozen\(base\)"):
        lora.model_params(adapters, base)


def test_qlora_training_moves_only_the_adapters(base):
    """Gradients have the adapters' structure (the NF4 base is no argument of the gradient), the
    optimiser holds moments for the adapters only, and the frozen codes never change."""
    lora = LoRA(LoraConfig(rank=4, targets=("q", "v", "up"), base_quantization="nf4"))
    frozen = lora.frozen(base)
    before = jax.tree.map(np.array, frozen)
    tokens = jnp.tile(jnp.arange(10) % 5, (2, 1))

    def loss(params, batch, key):
        logits = forward(params, CFG, batch[:, :-1])
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:])
        return ce.sum(), jnp.float32(ce.size), {}

    adapters = lora.init(base, _key(2))
    optimizer = optax.adam(3e-2)
    state = TrainState.create(adapters, optimizer, 0)
    shapes = sorted(x.shape for x in jax.tree.leaves(adapters))
    assert sorted(x.shape for x in jax.tree.leaves(state.opt_state) if x.ndim) == sorted(2 * shapes)
    update = jax.jit(make_update(loss, optimizer, lora))
    losses = []
    for _ in range(6):
        state, metrics = update(state, frozen, tokens)
        losses.append(float(metrics["loss"]))
    assert losses[-1] < losses[0] - 0.1
    assert jax.tree.structure(state.params) == jax.tree.structure(adapters)
    jax.tree.map(np.testing.assert_array_equal, frozen, before)
    assert all(not np.array_equal(state.params[n]["b"], adapters[n]["b"]) for n in adapters)


TOOLS = TaskSpec(
    generators=(Arithmetic(1),), num_train=16, num_heldout=4, max_length=176, action_length=32
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("base")
    task_model_dir(path, max_seq_len=224)
    return path


def _sft_losses(run_dir, workdir, finetune):
    train_sft(
        str(workdir),
        init_from=str(run_dir),
        tasks=TOOLS,
        steps=6,
        batch_size=4,
        peak_lr=3e-2,
        warmup_steps=0,
        finetune=finetune,
        eval_every=3,
        checkpoint_every=6,
        progress=False,
    )
    return [r["eval_loss"] for r in read_metrics(workdir / "metrics.jsonl") if "eval_loss" in r]


def test_sft_with_qlora_lowers_the_held_out_loss_and_saves_a_float_model(run_dir, tmp_path):
    lora = LoRA(LoraConfig(rank=2, targets=("q", "v", "up"), base_quantization="nf4"))
    first, last = _sft_losses(run_dir, tmp_path / "qlora", lora)
    assert last < first
    _, params, _ = load_checkpoint(str(tmp_path / "qlora"))
    assert not any(is_quantized(x) for x in jax.tree.leaves(params, is_leaf=is_quantized))


def test_sft_with_dora_lowers_the_held_out_loss(run_dir, tmp_path):
    lora = LoRA(LoraConfig(rank=2, targets=("q", "v", "up"), variant="dora", lora_plus_ratio=4.0))
    first, last = _sft_losses(run_dir, tmp_path / "dora", lora)
    assert last < first
