"""DeepSeek-V3's routing: the sigmoid router, group-limited top-k, renormalised and scaled gates,
the sequence-wise balance loss, every dispatch path and the aux-free bias with them; and MLA's
YaRN softmax factor (``mscale_all_dim``).  Transformers' logits are compared in
test_hf_families.py; here each piece is checked against a slow numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from decoding_oracle import assert_generate_matches_forward, prompts
from decoding_oracle import random_params as decoding_params
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.models import TransformerConfig, init_params, moe
from agentic_jax.models.rope import mla_softmax_factor
from agentic_jax.training import TrainState, make_optimizer, make_schedule, make_train_step
from sharding import activate, make_mesh

SIGMOID = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24,
    n_experts=8, experts_per_token=3, moe_d_ff=16, n_shared_experts=1, router="sigmoid_topk",
    n_expert_groups=4, topk_groups=2, normalize_gates=True, routed_scaling_factor=2.5,
)  # fmt: skip


def reference_route(logits, bias, c: TransformerConfig):
    """``transformers``' ``DeepseekV3TopkRouter``, one token at a time in numpy: (experts in
    descending biased score, gates)."""
    size = c.n_experts // c.n_expert_groups
    experts, gates = [], []
    for row in logits:
        scores = 1 / (1 + np.exp(-row))
        choice = scores + bias
        grouped = choice.reshape(c.n_expert_groups, size)
        group_scores = [np.sort(group)[-2:].sum() for group in grouped]
        groups = np.argsort(group_scores)[::-1][: c.topk_groups]
        candidates = [e for g in groups for e in range(g * size, (g + 1) * size)]
        chosen = sorted(candidates, key=lambda e: -choice[e])[: c.experts_per_token]
        w = scores[chosen]
        if c.normalize_gates:
            w = w / w.sum()
        experts.append(chosen)
        gates.append(w * c.routed_scaling_factor)
    return np.array(experts), np.array(gates)


@st.composite
def _routings(draw):
    e, groups = draw(st.sampled_from([(4, 2), (6, 3), (8, 4), (8, 2), (8, 8)]))
    best = draw(st.integers(1, groups))
    k = draw(st.integers(1, min(best * (e // groups), 4)))
    config = SIGMOID.replace(
        n_experts=e,
        experts_per_token=k,
        n_expert_groups=groups,
        topk_groups=best,
        normalize_gates=draw(st.booleans()),
        routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
    )
    return config, draw(st.integers(0, 2**16))


@given(_routings())
def test_group_limited_sigmoid_routing_equals_the_numpy_reference(routing):
    config, seed = routing
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(16, config.d_model)).astype(np.float32)
    p = {
        "router": rng.normal(size=(config.d_model, config.n_experts)).astype(np.float32),
        "router_bias": rng.normal(0, 0.3, config.n_experts).astype(np.float32),
    }
    experts, gates, _, probs = moe.route(p, jnp.asarray(x), config)
    want_experts, want_gates = reference_route(x @ p["router"], p["router_bias"], config)
    np.testing.assert_array_equal(experts, want_experts)
    np.testing.assert_allclose(gates, want_gates, rtol=1e-5)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)


@given(
    router=st.sampled_from(["sigmoid_topk", "softmax_topk", "topk_softmax"]),
    scale=st.floats(0.1, 4.0),
    seed=st.integers(0, 2**16),
)
def test_normalised_gates_sum_to_the_routed_scaling_factor(router, scale, seed):
    config = SIGMOID.replace(router=router, routed_scaling_factor=scale)
    p = jax.tree.map(lambda a: a[0], init_params(config, jax.random.key(seed))["layers"]["moe"])
    x = jax.random.normal(jax.random.key(seed + 1), (10, config.d_model))
    _, gates, *_ = moe.route(p, x, config)
    np.testing.assert_allclose(gates.sum(-1), scale, rtol=1e-5)
    _, plain, *_ = moe.route(p, x, config.replace(normalize_gates=False))
    np.testing.assert_allclose(gates, plain / plain.sum(-1, keepdims=True) * scale, rtol=1e-5)


def _layer(config, seed=0):
    p = jax.tree.map(lambda a: a[0], init_params(config, jax.random.key(seed))["layers"]["moe"])
    bias = 0.3 * jax.random.normal(jax.random.key(seed + 1), (config.n_experts,))
    return {**p, "router": p["router"] * 50, "router_bias": bias}


def _loss(p, x, config):
    y, _ = moe.moe_mlp(p, x, config)
    return jnp.sum(y**2), y


@pytest.mark.parametrize("capacity_factor", [None, 1.0])
def test_dispatch_paths_agree_with_the_sigmoid_router(capacity_factor):
    """Ragged (one device and expert-parallel over 4 devices) equals the one-hot reference, in
    value and gradient."""
    config = SIGMOID.replace(capacity_factor=capacity_factor)
    p, x = _layer(config), jax.random.normal(jax.random.key(2), (8, 4, 16))
    grad = jax.jit(jax.value_and_grad(_loss, has_aux=True), static_argnums=2)
    (_, want), want_grads = grad(p, x, config.replace(moe_dispatch="dense"))
    (_, y), grads = grad(p, x, config)
    np.testing.assert_allclose(y, want, atol=1e-5)
    if capacity_factor is None:  # capacity is per device: only dropless routing is global
        with activate(make_mesh({"expert": 4, "data": 2})):
            (_, sharded), sharded_grads = grad(p, x, config)
        np.testing.assert_allclose(sharded, want, atol=1e-5)
        for a, b in zip(jax.tree.leaves(sharded_grads), jax.tree.leaves(want_grads)):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_the_sequence_wise_balance_loss_equals_its_formula():
    """DeepSeek-V3's ``E Σ_i f_i P_i`` per sequence (row), averaged over the rows."""
    config, rows, length = SIGMOID, 3, 5
    p = _layer(config)
    x = jax.random.normal(jax.random.key(4), (rows, length, 16))
    _, stats = moe.moe_mlp(p, x, config)
    experts, _, logits, _ = moe.route(p, x.reshape(-1, 16), config)
    experts = np.asarray(experts).reshape(rows, -1)
    scores = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
    normalised = (scores / scores.sum(-1, keepdims=True)).reshape(rows, length, -1)
    share = np.stack([np.bincount(row, minlength=8) for row in experts]) / experts.shape[1]
    want = np.mean(8 * np.sum(share * normalised.mean(1), axis=-1))
    np.testing.assert_allclose(stats["balance_loss"], want, rtol=1e-5)


def _train(config, steps=4):
    sched = make_schedule(1e-2, steps, kind="constant", warmup_steps=0)
    opt = make_optimizer(sched)
    state = TrainState.create(init_params(config, jax.random.key(0)), opt, seed=0)
    step = jax.jit(make_train_step(config, opt, sched))
    tokens = jax.random.randint(jax.random.key(1), (4, 17), 0, config.vocab_size)
    ones = jnp.ones((4, 16), jnp.int32)
    batch = {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": ones,
        "positions": jnp.broadcast_to(jnp.arange(16), (4, 16)),
        "loss_mask": ones,
    }
    losses = []
    for _ in range(steps):
        state, m = step(state, batch)
        losses.append(float(m["loss"]))
    return losses, state.params["layers"]["moe"]["router_bias"]


def test_a_sigmoid_routed_model_trains_and_only_the_balancing_rule_moves_its_bias():
    config = SIGMOID.replace(n_layers=1)
    losses, bias = _train(config.replace(aux_free_bias_rate=1e-2))
    assert losses[-1] < losses[0]
    assert float(jnp.abs(bias).max()) > 0
    # Without the rule the bias (a selection-only buffer, zero gradient) stays where it was.
    _, still = _train(config, steps=2)
    np.testing.assert_array_equal(still, 0.0)


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(router="sigmoid"), "router"),
        (dict(n_expert_groups=3), "n_expert_groups"),
        (dict(n_expert_groups=0), "n_expert_groups"),
        (dict(topk_groups=5), "topk_groups"),
        (dict(topk_groups=1, experts_per_token=3), "experts_per_token=3 exceeds"),
        (dict(routed_scaling_factor=0.0), "routed_scaling_factor"),
    ],
)
def test_invalid_routing_configs(changes, match):
    with pytest.raises(ValueError, match=match):
        SIGMOID.replace(**changes)


MLA_YARN = TransformerConfig(
    vocab_size=61, d_model=32, n_layers=2, n_heads=4, d_ff=48, max_seq_len=32,
    attention_type="mla", q_lora_rank=12, kv_lora_rank=16, qk_nope_head_dim=8,
    qk_rope_head_dim=4, v_head_dim=6,
    rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                  "mscale": 0.707, "mscale_all_dim": 1.0},
)  # fmt: skip


def test_mla_yarn_softmax_factor_and_decoding():
    """``mscale(4, 1)²`` scales MLA's softmax (GQA ignores it, as HF does), in the absorbed
    decoding path as in the training path."""
    np.testing.assert_allclose(mla_softmax_factor(MLA_YARN), (0.1 * np.log(4.0) + 1) ** 2)
    assert mla_softmax_factor(MLA_YARN.replace(rope_scaling={"type": "linear", "factor": 2})) == 1
    assert_generate_matches_forward(decoding_params(MLA_YARN), MLA_YARN, prompts(MLA_YARN))
