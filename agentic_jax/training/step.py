"""The jitted train and eval steps: forward, loss, gradient accumulation and the optax update."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from agentic_jax.models import TransformerConfig, forward, hidden_states, lm_head_weight
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.state import TrainState
from pallas_kernels import fused_cross_entropy as fused_cross_entropy_loss

BATCH_KEYS = ("tokens", "targets", "segment_ids", "positions", "loss_mask")


def model_batch(batch) -> dict:
    """The arrays of ``BATCH_KEYS`` from a data batch (pipelines may carry more keys)."""
    return {k: batch[k] for k in BATCH_KEYS}


def batch_loss(
    params,
    config: TransformerConfig,
    batch,
    *,
    z_loss: float = 0.0,
    fused_cross_entropy: bool = False,
):
    """(total, count, metrics) of next-token cross-entropy on one batch of packed rows.

    ``fused_cross_entropy`` computes the LM head and the loss in vocabulary chunks
    (``pallas_kernels.fused_cross_entropy``) so the ``[B, T, V]`` logits never exist.
    """
    kwargs = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
    if not fused_cross_entropy:
        logits = forward(params, config, batch["tokens"], **kwargs)
        return cross_entropy(logits, batch["targets"], batch["loss_mask"], z_loss=z_loss)
    if z_loss:
        raise ValueError(
            "z_loss needs the logits' normaliser; it is not available with fused_cross_entropy=True"
        )
    hidden = hidden_states(params, config, batch["tokens"], **kwargs)
    mask = batch["loss_mask"] > 0
    labels = jnp.where(mask, batch["targets"], -100)
    total = jnp.sum(fused_cross_entropy_loss(hidden, lm_head_weight(params, config), labels))
    return total, jnp.sum(mask, dtype=jnp.float32), {"nll": total}


def _split_micro(batch, accum_steps: int):
    rows = batch["tokens"].shape[0]
    if rows % accum_steps:
        raise ValueError(
            f"batch of {rows} rows does not split into accum_steps={accum_steps} micro-batches"
        )
    return jax.tree.map(lambda x: x.reshape(accum_steps, rows // accum_steps, *x.shape[1:]), batch)


def make_train_step(
    config: TransformerConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    z_loss: float = 0.0,
    accum_steps: int = 1,
    fused_cross_entropy: bool = False,
):
    """Returns ``step(state, batch) -> (state, metrics)``, not yet jitted.

    Gradients of the micro-batches are *summed* with their token counts and divided once by the
    total count, so ``accum_steps`` changes memory use but not the update.
    """

    def grad_fn(params, micro):
        def loss(p):
            total, count, m = batch_loss(
                p, config, micro, z_loss=z_loss, fused_cross_entropy=fused_cross_entropy
            )
            return total, (count, m["nll"])

        return jax.value_and_grad(loss, has_aux=True)(params)

    def step(state: TrainState, batch):
        micro = _split_micro(model_batch(batch), accum_steps)

        def body(carry, mb):
            (total, (count, nll)), grads = grad_fn(state.params, mb)
            acc_g, acc_t, acc_c, acc_n = carry
            return (
                jax.tree.map(jnp.add, acc_g, grads),
                acc_t + total,
                acc_c + count,
                acc_n + nll,
            ), None

        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
        init = (zeros, jnp.zeros(()), jnp.zeros(()), jnp.zeros(()))
        (grads, total, count, nll), _ = jax.lax.scan(body, init, micro)
        denom = jnp.maximum(count, 1.0)
        grads = jax.tree.map(lambda g, p: (g / denom).astype(p.dtype), grads, state.params)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": total / denom,
            "nll": nll / denom,
            "perplexity": jnp.exp(nll / denom),
            "grad_norm": optax.tree.norm(grads),
            "lr": schedule(state.step),
            "tokens": count,
        }
        return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

    return step


def make_eval_step(config: TransformerConfig, *, fused_cross_entropy: bool = False):
    """Returns ``eval_step(params, batch) -> (nll_sum, count)``, not yet jitted."""

    def eval_step(params, batch):
        total, count, _ = batch_loss(params, config, batch, fused_cross_entropy=fused_cross_entropy)
        return total, count

    return eval_step
