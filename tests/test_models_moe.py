"""Mixture of experts: the layer against dense and one-hot references, capacity, balancing, the
auxiliary losses, training, checkpoint resume and decoding."""

import gin
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import CORPUS

from agentic_jax.data.tokenizer import train_tokenizer
from agentic_jax.inference import PromptBatch, SamplingParams, generate
from agentic_jax.models import TransformerConfig, forward, init_params, moe, param_count
from agentic_jax.models.export import load_model
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from agentic_jax.training.loop import train
from agentic_jax.training.metrics import read_metrics
from agentic_jax.training.step import batch_loss, make_eval_step

BASE = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24
)
MOE = BASE.replace(n_experts=4, experts_per_token=2, moe_d_ff=16)


def _layer_params(config, key=0):
    """One MoE layer's parameters (the model's, first layer), router scaled up so routing varies."""
    p = jax.tree.map(lambda a: a[0], init_params(config, jax.random.key(key))["layers"]["moe"])
    return {**p, "router": p["router"] * 50}


def test_one_expert_with_k1_is_the_dense_mlp():
    dense = BASE
    params = init_params(dense, jax.random.key(0))
    config = BASE.replace(n_experts=1, experts_per_token=1, router_aux_loss_coef=0.0)
    mlp = params["layers"]["mlp"]
    moe_params = {**params, "layers": {k: v for k, v in params["layers"].items() if k != "mlp"}}
    moe_params["layers"]["moe"] = {
        "router": jnp.zeros((2, 16, 1)),
        **{name: mlp[name][:, None] for name in ("gate", "up", "down")},
    }
    tokens = jax.random.randint(jax.random.key(2), (2, 8), 0, 32)
    np.testing.assert_allclose(
        forward(moe_params, config, tokens), forward(params, dense, tokens), atol=1e-5
    )


@settings(max_examples=4)
@given(
    n=st.sampled_from([3, 8]),
    e=st.sampled_from([2, 5]),
    k=st.integers(1, 3),
    router=st.sampled_from(["softmax_topk", "topk_softmax"]),
    capacity_factor=st.sampled_from([None, 0.5, 1.0, 2.0]),
    shared=st.integers(0, 1),
)
def test_ragged_dispatch_equals_the_one_hot_reference(n, e, k, router, capacity_factor, shared):
    config = MOE.replace(
        n_experts=e,
        experts_per_token=min(k, e),
        router=router,
        capacity_factor=capacity_factor,
        n_shared_experts=shared,
    )
    p = _layer_params(config)
    x = jax.random.normal(jax.random.key(n), (1, n, 16))
    y, stats = moe.moe_mlp(p, x, config)
    want, want_stats = moe.moe_mlp(p, x, config.replace(moe_dispatch="dense"))
    np.testing.assert_allclose(y, want, atol=1e-5)
    assert int(stats["dropped"]) == int(want_stats["dropped"])


def _numpy_keep(experts, n_experts, cap):
    """Slot-major priority, one assignment at a time: the slow reference of capacity_keep."""
    keep = np.zeros(experts.shape, bool)
    taken = np.zeros(n_experts, int)
    for slot in range(experts.shape[1]):
        for token in range(experts.shape[0]):
            e = experts[token, slot]
            keep[token, slot] = taken[e] < cap
            taken[e] += 1
    return keep


@given(seed=st.integers(0, 1000), cap=st.integers(1, 6))
def test_capacity_drops_exactly_the_overflow(seed, cap):
    rng = np.random.default_rng(seed)
    # Distinct experts per token, skewed towards expert 0 so that it overflows.
    experts = np.stack(
        [rng.choice(4, 2, replace=False, p=[0.55, 0.15, 0.15, 0.15]) for _ in range(10)]
    )
    keep = np.asarray(moe.capacity_keep(jnp.asarray(experts), 4, cap))
    np.testing.assert_array_equal(keep, _numpy_keep(experts, 4, cap))
    # The layer drops them too: a dropped assignment contributes nothing to its token.
    config = MOE.replace(capacity_factor=cap * 4 / (10 * 2))
    p = _layer_params(config)
    x = jax.random.normal(jax.random.key(seed), (10, 16))
    gates = jnp.full(experts.shape, 0.5)
    weights = {name: p[name] for name in ("gate", "up", "down")}
    y, dropped = moe._dispatch(x, jnp.asarray(experts), gates, **weights, n_experts=4, cap=cap)
    assert int(dropped) == int((~keep).sum())
    per_expert = jax.vmap(moe.swiglu, in_axes=(None, 0, 0, 0))(x, *weights.values())
    want = sum(
        np.where(keep[:, j, None], 0.5 * np.asarray(per_expert)[experts[:, j], np.arange(10)], 0)
        for j in range(2)
    )
    np.testing.assert_allclose(y, want, atol=1e-5)


def test_aux_free_bias_moves_load_toward_balance():
    config = MOE.replace(aux_free_bias_rate=0.01)
    p = jax.tree.map(lambda a: a[0], init_params(config, jax.random.key(0))["layers"]["moe"])
    x = jax.random.normal(jax.random.key(3), (256, 16)).at[:, 0].set(1.0)  # a constant feature
    # Diverse routing, but the constant feature gives expert 0 a head start with every token.
    p["router"] = (0.5 * jax.random.normal(jax.random.key(4), (16, 4))).at[0].set([2.0, 0, 0, 0])
    params = {"layers": {"moe": jax.tree.map(lambda a: a[None], p)}}

    def spread(params):
        experts, *_ = moe.route(jax.tree.map(lambda a: a[0], params["layers"]["moe"]), x, config)
        load = jnp.bincount(experts.reshape(-1), length=4)
        return load, float(load.max() - load.min())

    load, before = spread(params)
    for _ in range(50):
        load, _ = spread(params)
        params = moe.move_router_bias(params, params, load[None].astype(jnp.float32), 0.01)
    _, after = spread(params)
    assert after < 0.25 * before, (before, after)
    assert float(params["layers"]["moe"]["router_bias"][0, 0]) < 0  # the favourite is held back


def test_aux_losses_equal_their_formulas_on_a_hand_made_example():
    """Router = identity on 2 dims, so the logits are the tokens themselves."""
    config = TransformerConfig(
        vocab_size=8, d_model=2, n_layers=1, n_heads=1, n_kv_heads=1, head_dim=2, d_ff=2,
        n_experts=2, experts_per_token=1,
    )  # fmt: skip
    logits = np.array([[2.0, 0.0], [1.0, 0.0], [0.0, 3.0], [0.5, 0.0]], np.float32)
    p = {
        "router": jnp.eye(2),
        "gate": jnp.zeros((2, 2, 2)),
        "up": jnp.zeros((2, 2, 2)),
        "down": jnp.zeros((2, 2, 2)),
    }
    _, stats = moe.moe_mlp(p, jnp.asarray(logits)[None], config)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    f = np.array([3, 1]) / 4  # tokens 0, 1, 3 choose expert 0; token 2 expert 1
    np.testing.assert_allclose(stats["balance_loss"], 2 * np.sum(f * probs.mean(0)), rtol=1e-6)
    lse = np.log(np.exp(logits).sum(1))
    np.testing.assert_allclose(stats["z_loss"], np.mean(lse**2), rtol=1e-6)
    np.testing.assert_allclose(stats["load"], [3, 1])
    entropy = -np.mean(np.sum(probs * np.log(probs), 1))
    np.testing.assert_allclose(stats["entropy"], entropy, rtol=1e-6)


def test_config_validation_and_parameter_accounting():
    with pytest.raises(ValueError, match="experts_per_token"):
        BASE.replace(n_experts=2, experts_per_token=3)
    with pytest.raises(ValueError, match="router"):
        MOE.replace(router="sigmoid")
    with pytest.raises(ValueError, match="capacity_factor"):
        MOE.replace(capacity_factor=0.0)
    with pytest.raises(ValueError, match="moe_layers"):
        MOE.replace(moe_layers=(5,))
    assert MOE.replace(moe_layers=2).moe_layer_ids == (1,)
    assert MOE.replace(moe_layers=[0]).moe_layers == (0,)
    # Two of four experts active: half the routed experts' weights are idle per token.
    idle = MOE.n_layers * 2 * 3 * 16 * 16
    assert param_count(MOE) - param_count(MOE, active=True) == idle
    assert param_count(BASE, active=True) == param_count(BASE)


def _batch(config, rows=4, length=16, seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (rows, length + 1), 0, config.vocab_size)
    ones = jnp.ones((rows, length), jnp.int32)
    return {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": ones,
        "positions": jnp.broadcast_to(jnp.arange(length), (rows, length)),
        "loss_mask": ones,
    }


def test_a_tiny_moe_model_trains_and_logs_router_metrics():
    config = MOE.replace(
        moe_layers=(1,), n_shared_experts=1, router_noise=0.1, aux_free_bias_rate=1e-3,
        capacity_factor=1.0,
    )  # fmt: skip
    sched = make_schedule(1e-2, 20, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched)
    params = init_params(config, jax.random.key(0))
    state = TrainState.create(params, opt, seed=0)
    step = jax.jit(make_train_step(config, opt, sched))
    batch = _batch(config)
    losses = []
    for _ in range(15):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    assert losses[-1] < 0.7 * losses[0]
    loads = [float(m[f"moe_load_{i}"]) for i in range(4)]
    np.testing.assert_allclose(sum(loads), 1.0, rtol=1e-5)
    assert 0 <= float(m["moe_dropped_fraction"]) < 1
    assert 0 < float(m["moe_router_entropy"]) <= np.log(4) + 1e-5
    bias = state.params["layers"]["moe"]["router_bias"]
    assert float(jnp.abs(bias).max()) > 0  # moved by the balancing rule, not the optimiser


def test_moe_model_trains_and_resumes_through_the_training_loop(tmp_path):
    train_tokenizer(tmp_path / "tok.json", files=[CORPUS], vocab_size=300)
    config = MOE.replace(aux_free_bias_rate=1e-3, capacity_factor=2.0)
    kwargs = dict(
        model=config, tokenizer_path=str(tmp_path / "tok.json"), batch_size=8, seq_len=16,
        checkpoint_every=2, eval_every=100, eval_batches=1, log_every=1, progress=False,
    )  # fmt: skip
    gin.parse_config("make_schedule.warmup_steps = 0\nmake_schedule.peak_lr = 1e-2")
    try:
        train(str(tmp_path / "run"), steps=2, **kwargs)
        _, after_two = load_model(tmp_path / "run" / "model")
        train(str(tmp_path / "run"), steps=4, **kwargs)  # resumes from step 2
        _, after_four = load_model(tmp_path / "run" / "model")  # the extended run's model
    finally:
        gin.clear_config()
    records = [r for r in read_metrics(str(tmp_path / "run" / "metrics.jsonl")) if "loss" in r]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all("moe_load_0" in r and "moe_router_entropy" in r for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    moved = jax.tree.leaves(jax.tree.map(lambda a, b: bool((a != b).any()), after_two, after_four))
    assert any(moved)
    assert not (tmp_path / "run" / "model.new").exists()
    assert not (tmp_path / "run" / "model.old").exists()


def test_decoding_an_moe_model_matches_its_forward():
    config = MOE.replace(capacity_factor=1.0, aux_free_bias_rate=1e-3, moe_layers=(0,))
    params = init_params(config, jax.random.key(0))
    prompts = [[5, 6, 7, 8], [9, 10]]
    result = generate(
        params,
        config,
        PromptBatch.from_lists(prompts, padding="left", length=4),
        sampling=SamplingParams(max_tokens=4, temperature=0.0),
        key=jax.random.key(1),
        return_logits=True,
    )
    for b, prompt in enumerate(prompts):
        n = int(result.lengths[b])
        seq = prompt + np.asarray(result.tokens[b, :n]).tolist()
        # Decoding is dropless; so is the forward here (one row: no expert overflows).
        full = forward(params, config.replace(capacity_factor=None), jnp.array([seq]))
        np.testing.assert_allclose(
            result.logits[b, :n], full[0, len(prompt) - 1 : len(prompt) - 1 + n], atol=2e-5
        )


def test_the_eval_loss_is_the_likelihood_without_the_router_losses():
    config = MOE.replace(router_aux_loss_coef=0.5, router_z_loss_coef=0.5)
    params, batch = init_params(config, jax.random.key(0)), _batch(config)
    nll, count = make_eval_step(config)(params, batch)
    plain = config.replace(router_aux_loss_coef=0.0, router_z_loss_coef=0.0)
    np.testing.assert_allclose(nll, make_eval_step(plain)(params, batch)[0], rtol=1e-6)
    training_total = batch_loss(params, config, batch)[0]  # with the router losses
    assert float(training_total) > float(nll)
    assert int(count) == batch["loss_mask"].size
