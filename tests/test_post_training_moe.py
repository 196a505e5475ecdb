"""Post-training a mixture of experts: every trainer's update (``training.make_update``) adds the
router's auxiliary losses, logs its metrics and moves the auxiliary-loss-free bias."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from agentic_jax.models import TransformerConfig, forward, init_params, moe
from agentic_jax.post_training.common import token_logits
from agentic_jax.post_training.reward import WithHead, init_reward_model, outcome_loss
from agentic_jax.post_training.sft import sft_loss
from agentic_jax.training import TrainState
from agentic_jax.training.update import make_update

CONFIG = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=24,
    n_experts=4, experts_per_token=2, moe_d_ff=16,
    router_aux_loss_coef=0.3, router_z_loss_coef=0.1,
)  # fmt: skip


def _sft_batch(rows=4, length=12, seed=0):
    tokens = jax.random.randint(jax.random.key(seed), (rows, length + 1), 0, CONFIG.vocab_size)
    mask = (jnp.arange(length) >= 3).astype(jnp.int32) * jnp.ones((rows, 1), jnp.int32)
    return {
        "tokens": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": jnp.ones((rows, length), jnp.int32),
        "positions": jnp.broadcast_to(jnp.arange(length), (rows, length)),
        "loss_mask": mask,
    }


def _by_hand(params, batch):
    """The SFT loss with the router's auxiliary loss, from the forward's own ``aux``."""
    logits, aux = forward(
        params, CONFIG, batch["tokens"], positions=batch["positions"], return_aux=True
    )
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), batch["targets"][..., None], -1)[..., 0]
    mask = batch["loss_mask"]
    ce = jnp.sum(nll * mask) / jnp.sum(mask)
    balance, z = aux["balance_loss"].mean(), aux["z_loss"].mean()
    return ce + 0.3 * balance + 0.1 * z, aux


def test_an_sft_step_adds_the_router_losses_and_their_gradient():
    params = init_params(CONFIG, jax.random.key(0))
    batch = _sft_batch()
    optimizer = optax.sgd(0.1)
    update = jax.jit(make_update(sft_loss(CONFIG), optimizer))
    state, metrics = update(TrainState.create(params, optimizer, seed=0), None, batch)

    (want, aux), grads = jax.jit(jax.value_and_grad(_by_hand, has_aux=True))(params, batch)
    assert float(aux["loss"]) > 0.05  # the aux term is not negligible against the tolerance
    np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5)
    for new, old, g in zip(*map(jax.tree.leaves, (state.params, params, grads))):
        np.testing.assert_allclose(new, old - 0.1 * g, rtol=1e-4, atol=1e-6)
    shares = [float(metrics[f"moe_load_{i}"]) for i in range(4)]
    np.testing.assert_allclose(shares, aux["load"].sum(0) / aux["load"].sum(), rtol=1e-6)
    np.testing.assert_allclose(metrics["moe_balance_loss"], aux["balance_loss"].mean(), rtol=1e-5)
    assert "moe_expert_load" not in metrics  # the raw sums became the logged shares


def _pair_batch(rows=8, length=10, seed=1):
    chosen, rejected = jax.random.randint(
        jax.random.key(seed), (2, rows, length), 0, CONFIG.vocab_size
    )
    mask = jnp.ones((rows, length), jnp.int32)
    return {
        "chosen": chosen,
        "rejected": rejected,
        "chosen_mask": mask,
        "rejected_mask": mask,
        "weight": jnp.ones((rows,), jnp.float32),
    }


def test_a_reward_model_step_moves_the_router_bias_toward_balance():
    """The bias lives in the reward model's ``trunk``.  It starts favouring expert 0, which then
    takes every token's first slot; with the optimiser at rate 0 only the balancing rule moves
    anything, by ``rate · sign(mean load − load)`` a step, and the loads even out."""
    rate = 0.005
    config = CONFIG.replace(aux_free_bias_rate=rate)
    trunk = init_params(config, jax.random.key(0))
    bias = trunk["layers"]["moe"]["router_bias"].at[:, 0].set(0.06)
    trunk["layers"]["moe"]["router_bias"] = bias
    optimizer = optax.sgd(0.0)
    update = jax.jit(
        make_update(outcome_loss(config), optimizer, WithHead(), router_bias_rate=rate)
    )
    state = TrainState.create(init_reward_model(trunk, config), optimizer, seed=0)
    spreads = []
    for _ in range(12):
        new, metrics = update(state, None, _pair_batch())
        shares = np.array([metrics[f"moe_load_{i}"] for i in range(4)])
        spreads.append(shares.max() - shares.min())
        moved = new.params["trunk"]["layers"]["moe"]["router_bias"]
        np.testing.assert_allclose(
            moved, state.params["trunk"]["layers"]["moe"]["router_bias"]
            + rate * np.sign(0.25 - shares), atol=1e-7
        )  # fmt: skip
        state = new
    assert max(spreads[-2:]) < 0.5 * spreads[0], spreads
    assert float(moved[0, 0]) < 0.06  # the favourite is held back


def test_a_model_with_a_router_bias_needs_the_rate():
    config = CONFIG.replace(aux_free_bias_rate=0.01)
    params = init_params(config, jax.random.key(0))
    optimizer = optax.sgd(0.1)
    update = make_update(sft_loss(config), optimizer)
    with pytest.raises(ValueError, match="router_bias_rate"):
        update(TrainState.create(params, optimizer, seed=0), None, _sft_batch())


def test_a_disabled_collector_hides_a_teachers_forward():
    params = init_params(CONFIG, jax.random.key(0))
    tokens = _sft_batch()["tokens"]
    with moe.collect_aux() as forwards:
        token_logits(params, CONFIG, tokens)
        with moe.collect_aux(enabled=False):
            token_logits(params, CONFIG, tokens)
    assert len(forwards) == 1
