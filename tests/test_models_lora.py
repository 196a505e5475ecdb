"""LoRA adapters: exact start, adapter forward = merged weights, frozen base, dropout, checkpoints."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.models import TransformerConfig, forward, init_params
from agentic_jax.models.lora import (
    PROJECTIONS,
    LoRA,
    LoraConfig,
    load_adapters,
    lora_axes,
    save_adapters,
)
from agentic_jax.post_training.common import tree_fingerprint
from sharding import logical_to_specs

CFG = TransformerConfig(
    vocab_size=61,
    d_model=16,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=4,
    d_ff=24,
    max_seq_len=32,
)
UNROLLED = CFG.replace(scan_layers=False)  # run eagerly: op by op, no compile per example
UNTIED = UNROLLED.replace(tie_embeddings=False)
TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, CFG.vocab_size, (2, 10)), jnp.int32)
_forward = jax.jit(forward, static_argnums=1)


def _key(seed):
    """An RBG key: far cheaper for XLA:CPU to compile than threefry (the default, used by the
    dropout test)."""
    return jax.random.key(seed, impl="rbg")


@pytest.fixture(scope="module")
def base():
    return jax.jit(init_params, static_argnums=0)(CFG, _key(0))


@pytest.fixture(scope="module")
def untied_base():
    return jax.jit(init_params, static_argnums=0)(UNTIED, _key(0))


def _random_adapters(lora, base, seed, std=0.5):
    """Adapters with nonzero A and B (B is zero after init, which would hide every merge error);
    drawn by numpy, so that no example compiles a random-number kernel for its shapes."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, std, s.shape), s.dtype),
        jax.eval_shape(lora.init, base, _key(0)),
    )


def test_zero_b_gives_exactly_the_base_logits(base):
    lora = LoRA(LoraConfig(rank=4, dropout=0.3))
    adapters = lora.init(base, _key(2))
    assert all(float(jnp.abs(ad["a"]).max()) > 0 for ad in adapters.values())
    ref = _forward(base, CFG, TOKENS)
    np.testing.assert_array_equal(_forward(lora.model_params(adapters, base), CFG, TOKENS), ref)
    # Dropout only touches the adapter path, which is zero here.
    dropped = lora.model_params(adapters, base, jax.random.key(3))
    np.testing.assert_array_equal(_forward(dropped, CFG, TOKENS), ref)


@given(
    rank=st.integers(1, 4),
    targets=st.sets(st.sampled_from(tuple(PROJECTIONS)), min_size=1),
    tied=st.booleans(),
    seed=st.integers(0, 100),
)
def test_adapter_forward_equals_merged_weights(base, untied_base, rank, targets, tied, seed):
    cfg, base = (UNROLLED, base) if tied else (UNTIED, untied_base)
    lora = LoRA(LoraConfig(rank=rank, alpha=3.0, targets=tuple(sorted(targets))))
    adapters = _random_adapters(lora, base, seed)
    with_adapters = forward(lora.model_params(adapters, base), cfg, TOKENS)
    merged = lora.merged(adapters, base)
    assert "lora" not in merged["layers"]
    np.testing.assert_allclose(forward(merged, cfg, TOKENS), with_adapters, atol=1e-5)
    assert np.abs(forward(base, cfg, TOKENS) - with_adapters).max() > 1e-3


def test_merged_equals_an_independent_dense_delta(base):
    """The merge, by numpy: W_o[l] + (α/r) · (A[l] reshaped [N·H, r]) @ B[l]."""
    lora = LoRA(LoraConfig(rank=3, alpha=6.0, targets=("o",)))
    adapters = _random_adapters(lora, base, 4)
    a, b, w = (
        np.asarray(x, np.float64)
        for x in (adapters["o"]["a"], adapters["o"]["b"], base["layers"]["attn"]["o"])
    )
    want = np.stack(
        [w[i] + 2.0 * (a[i].reshape(-1, 3) @ b[i]).reshape(w[i].shape) for i in range(2)]
    )
    np.testing.assert_allclose(lora.merged(adapters, base)["layers"]["attn"]["o"], want, atol=1e-6)


def test_unmerge_recovers_the_base(base):
    lora = LoRA(LoraConfig(rank=4, targets=("q", "o", "down")))
    adapters = _random_adapters(lora, base, 5)
    merged = lora.merged(adapters, base)
    assert not np.allclose(merged["layers"]["attn"]["q"], base["layers"]["attn"]["q"])
    restored = lora.unmerge(merged, adapters)
    assert jax.tree.structure(restored) == jax.tree.structure(base)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), restored, base)
    np.testing.assert_array_equal(restored["layers"]["mlp"]["up"], base["layers"]["mlp"]["up"])


def test_training_moves_only_the_adapters_and_lowers_the_loss(base):
    lora = LoRA(LoraConfig(rank=4, targets=("q", "v", "up")))
    adapters = lora.init(base, _key(6))
    tokens = jnp.tile(jnp.arange(10) % 5, (2, 1))  # a periodic sequence: learnable
    base_copy = jax.tree.map(np.array, base)
    optimizer = optax.adam(3e-2)
    opt_state = optimizer.init(adapters)
    adapter_shapes = sorted(x.shape for x in jax.tree.leaves(adapters))
    assert sorted(x.shape for x in jax.tree.leaves(opt_state) if x.ndim) == sorted(
        2 * adapter_shapes
    )

    def loss_fn(trainable):
        logits = forward(lora.model_params(trainable, base), CFG, tokens[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    @jax.jit
    def step(trainable, opt_state):
        loss, grads = jax.value_and_grad(loss_fn)(trainable)
        updates, opt_state = optimizer.update(grads, opt_state)
        return optax.apply_updates(trainable, updates), opt_state, loss

    trained = adapters
    losses = []
    for _ in range(8):
        trained, opt_state, loss = step(trained, opt_state)
        losses.append(float(loss))
    assert losses[-1] < losses[0] - 0.1
    jax.tree.map(np.testing.assert_array_equal, base, base_copy)
    assert all(not np.array_equal(trained[n]["b"], adapters[n]["b"]) for n in trained)


def test_dropout_changes_outputs_only_with_a_key(base):
    lora = LoRA(LoraConfig(rank=4, dropout=0.5))
    adapters = _random_adapters(lora, base, 7)
    plain = _forward(lora.model_params(adapters, base), CFG, TOKENS)
    np.testing.assert_allclose(plain, _forward(lora.merged(adapters, base), CFG, TOKENS), atol=1e-5)
    dropped = [
        _forward(lora.model_params(adapters, base, jax.random.key(k)), CFG, TOKENS) for k in (1, 2)
    ]
    assert not np.allclose(dropped[0], plain, atol=1e-3)
    assert not np.allclose(dropped[0], dropped[1], atol=1e-3)
    np.testing.assert_array_equal(
        dropped[0], _forward(lora.model_params(adapters, base, jax.random.key(1)), CFG, TOKENS)
    )
    no_rate = LoRA(LoraConfig(rank=4, dropout=0.0))
    np.testing.assert_array_equal(
        _forward(no_rate.model_params(adapters, base, jax.random.key(1)), CFG, TOKENS), plain
    )


def test_unrolled_layers_dropout_and_gradients_equal_scanned(base):
    lora = LoRA(LoraConfig(rank=2, dropout=0.2, targets=("k", "gate")))
    adapters = _random_adapters(lora, base, 8)

    def loss(trainable, cfg):
        return forward(lora.model_params(trainable, base, _key(9)), cfg, TOKENS).sum()

    value_and_grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)
    scanned, unrolled = (value_and_grad(adapters, cfg) for cfg in (CFG, UNROLLED))
    jax.tree.map(
        lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-4), scanned, unrolled
    )


def test_bf16_adapter_path_as_accurate_as_bf16_merged_weights(base):
    lora = LoRA(LoraConfig(rank=4))
    adapters = _random_adapters(lora, base, 10, std=0.1)
    params, merged = lora.model_params(adapters, base), lora.merged(adapters, base)
    exact = _forward(params, CFG, TOKENS)
    bf16 = CFG.replace(dtype="bfloat16")
    adapter_bf16, merged_bf16 = _forward(params, bf16, TOKENS), _forward(merged, bf16, TOKENS)
    assert adapter_bf16.dtype == jnp.float32
    error = np.abs(adapter_bf16 - exact).max()
    assert 0 < error <= 2 * np.abs(merged_bf16 - exact).max() + 1e-3


def test_adapter_axes_shard_on_a_mesh(base):
    lora_config = LoraConfig(rank=4)
    adapters = jax.eval_shape(LoRA(lora_config).init, base, _key(0))
    axes = lora_axes(CFG, lora_config)
    assert axes["q"] == {
        "a": ("layers", "embed", "lora_rank"),
        "b": ("layers", "lora_rank", "q_heads", "head_dim"),
    }
    assert axes["o"]["a"] == ("layers", "q_heads", "head_dim", "lora_rank")
    specs = logical_to_specs(axes, {"fsdp": 2, "tensor": 2}, shapes=adapters)
    assert specs["q"]["a"] == jax.sharding.PartitionSpec(None, "fsdp", None)
    assert specs["down"]["b"] == jax.sharding.PartitionSpec(None, None, "fsdp")


def test_adapter_checkpoint_round_trip_and_wrong_base(base, tmp_path):
    lora_config = LoraConfig(rank=2, alpha=4.0, dropout=0.1, targets=("v", "down"))
    adapters = jax.tree.map(
        lambda x: x.astype(jnp.bfloat16), _random_adapters(LoRA(lora_config), base, 11)
    )
    fingerprint = tree_fingerprint(base)
    save_adapters(tmp_path / "ad", adapters, lora_config, fingerprint)
    loaded, loaded_config = load_adapters(tmp_path / "ad", base_fingerprint=fingerprint)
    assert loaded_config == lora_config
    assert jax.tree.structure(loaded) == jax.tree.structure(adapters)
    jax.tree.map(np.testing.assert_array_equal, loaded, adapters)
    assert {x.dtype for x in jax.tree.leaves(loaded)} == {jnp.dtype(jnp.bfloat16)}
    other = tree_fingerprint(jax.tree.map(lambda x: x + 1, base))
    with pytest.raises(ValueError, match=r"trained on base .* not on this base"):
        load_adapters(tmp_path / "ad", base_fingerprint=other)
    with pytest.raises(FileExistsError):
        save_adapters(tmp_path / "ad", adapters, lora_config, fingerprint)
    with pytest.raises(FileNotFoundError, match="save_adapters"):
        load_adapters(tmp_path / "missing")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"rank": 0}, ValueError, "rank must be a positive integer"),
        ({"rank": 2.5}, ValueError, "rank must be a positive integer"),
        ({"alpha": 0.0}, ValueError, "alpha must be positive"),
        ({"dropout": 1.0}, ValueError, r"dropout must be in \[0, 1\)"),
        ({"targets": ()}, ValueError, "at least one"),
        ({"targets": ("q", "wq")}, ValueError, r"unknown: \['wq'\]"),
        ({"targets": ("q", "q")}, ValueError, "distinct"),
        ({"targets": "q"}, TypeError, "not the string"),
    ],
)
def test_bad_config_values_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        LoraConfig(**kwargs)


def test_mismatched_adapters_are_rejected(base):
    lora = LoRA(LoraConfig(rank=2, targets=("q",)))
    adapters = _random_adapters(lora, base, 0)
    with pytest.raises(ValueError, match=r"do not match LoraConfig\.targets"):
        LoRA(LoraConfig(rank=2, targets=("q", "k"))).model_params(adapters, base)
    with pytest.raises(ValueError, match=r"adapter 'q' has shapes .* rank 3 need"):
        LoRA(LoraConfig(rank=3, targets=("q",))).merged(adapters, base)
    with pytest.raises(ValueError, match="already carry LoRA adapters"):
        lora.model_params(adapters, lora.model_params(adapters, base))
    with pytest.raises(TypeError, match=r"LoRA\.config must be a LoraConfig"):
        LoRA({"rank": 2})


def test_gin_binds_the_config():
    gin.parse_config(["LoraConfig.rank = 3", "LoraConfig.targets = ['q', 'v']"])
    try:
        assert LoRA().config == LoraConfig(rank=3, targets=("q", "v"))
        gin.parse_config("LoRA.config = @LoraConfig()\nLoraConfig.alpha = 1.0")
        assert LoRA().config == LoraConfig(rank=3, alpha=1.0, targets=("q", "v"))
    finally:
        gin.clear_config()
    assert LoRA().config == LoraConfig()
