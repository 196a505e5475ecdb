"""The pretraining train and eval steps: next-token cross-entropy on packed batches."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from agentic_jax.models import TransformerConfig, forward, hidden_states, lm_head_weight
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.state import TrainState
from agentic_jax.training.update import make_update
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


def make_train_step(
    config: TransformerConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    z_loss: float = 0.0,
    accum_steps: int = 1,
    fused_cross_entropy: bool = False,
):
    """Returns ``step(state, batch) -> (state, metrics)``, not yet jitted: next-token
    cross-entropy through :func:`~agentic_jax.training.update.make_update`, the update path of
    every trainer, so ``accum_steps`` changes memory use but not the update."""

    def loss_fn(params, batch, key):
        del key  # pretraining runs without dropout
        return batch_loss(
            params, config, batch, z_loss=z_loss, fused_cross_entropy=fused_cross_entropy
        )

    update = make_update(loss_fn, optimizer, accum_steps=accum_steps)

    def step(state: TrainState, batch):
        new_state, m = update(state, None, model_batch(batch))
        nll = m["nll"] / jnp.maximum(m["count"], 1e-9)
        metrics = {
            "loss": m["loss"],
            "nll": nll,
            "perplexity": jnp.exp(nll),
            "grad_norm": m["grad_norm"],
            "lr": schedule(state.step),
            "tokens": m["count"],
        }
        return new_state, metrics

    return step


def make_eval_step(config: TransformerConfig, *, fused_cross_entropy: bool = False):
    """Returns ``eval_step(params, batch) -> (nll_sum, count)``, not yet jitted."""

    def eval_step(params, batch):
        total, count, _ = batch_loss(params, config, batch, fused_cross_entropy=fused_cross_entropy)
        return total, count

    return eval_step
