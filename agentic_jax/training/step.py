"""The pretraining train and eval steps: next-token cross-entropy on packed batches."""

from __future__ import annotations

import jax.numpy as jnp
import optax

from agentic_jax.models import (
    TransformerConfig,
    hidden_states,
    lm_head_weight,
    logits_from_hidden,
    moe,
)
from agentic_jax.training.loss import cross_entropy
from agentic_jax.training.loss_scale import DynamicLossScale
from agentic_jax.training.pipeline import Pipeline
from agentic_jax.training.qk_clip import hidden_states_with_max_logits, qk_clip
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
    max_logits: bool = False,
    key=None,
):
    """(total, count, metrics) of next-token cross-entropy on one batch of packed rows.

    ``fused_cross_entropy`` computes the LM head and the loss in vocabulary chunks
    (``pallas_kernels.fused_cross_entropy``) so the ``[B, T, V]`` logits never exist.
    ``max_logits`` also records each layer's per-head largest attention logit
    (``metrics["attn_logit_max"]``, for QK-Clip).  A mixture of experts adds its auxiliary loss
    (a per-token mean, so ``aux · count`` to the total) and its router metrics
    (:func:`agentic_jax.models.moe.loss_metrics`); ``key`` draws its router noise.
    """
    if fused_cross_entropy and z_loss:
        raise ValueError(
            "z_loss needs the logits' normaliser; it is not available with fused_cross_entropy=True"
        )
    if fused_cross_entropy and config.final_logit_softcap:
        raise ValueError(
            "final_logit_softcap caps the logits, which fused_cross_entropy=True never forms"
        )
    kwargs = dict(positions=batch["positions"], segment_ids=batch["segment_ids"])
    metrics = {}
    if max_logits:
        hidden, metrics["attn_logit_max"], aux = hidden_states_with_max_logits(
            params, config, batch["tokens"], key=key, **kwargs
        )
    else:
        hidden, aux = hidden_states(
            params, config, batch["tokens"], key=key, return_aux=True, **kwargs
        )
    if not fused_cross_entropy:
        logits = logits_from_hidden(params, config, hidden)
        total, count, ce = cross_entropy(
            logits, batch["targets"], batch["loss_mask"], z_loss=z_loss
        )
    else:
        mask = batch["loss_mask"] > 0
        labels = jnp.where(mask, batch["targets"], -100)
        total = jnp.sum(fused_cross_entropy_loss(hidden, lm_head_weight(params, config), labels))
        count, ce = jnp.sum(mask, dtype=jnp.float32), {"nll": total}
    total, metrics = moe.with_aux_loss(total, count, {**ce, **metrics}, aux)
    return total, count, metrics


def make_train_step(
    config: TransformerConfig,
    optimizer: optax.GradientTransformation,
    schedule: optax.Schedule,
    *,
    z_loss: float = 0.0,
    accum_steps: int = 1,
    fused_cross_entropy: bool = False,
    qk_clip_threshold: float | None = None,
    pipeline: Pipeline | None = None,
    loss_scale: DynamicLossScale | None = None,
):
    """Returns ``step(state, batch) -> (state, metrics)``, not yet jitted: next-token
    cross-entropy through :func:`~agentic_jax.training.update.make_update`, the update path of
    every trainer, so ``accum_steps`` changes memory use but not the update.

    ``qk_clip_threshold`` (tau) applies QK-Clip (:mod:`~agentic_jax.training.qk_clip`) after
    every optimiser step, from the per-head largest logits of the step's own forward pass, and
    logs ``attn_logit_max`` (the largest over heads and layers) and ``qk_clipped_heads``.
    A mixture of experts logs its router metrics (:func:`agentic_jax.models.moe.step_metrics`)
    and, with ``aux_free_bias_rate``, moves its router bias after the optimiser.
    ``pipeline`` runs the layers as pipeline stages over the mesh's ``stage`` axis
    (:mod:`~agentic_jax.training.pipeline`; same update) and logs ``pipeline_bubble``.
    ``loss_scale`` scales the loss dynamically (float16 compute; ``training.loss_scale``) and
    logs ``loss_scale`` and ``skipped``.
    """
    record = qk_clip_threshold is not None
    if record and loss_scale is not None:
        raise ValueError(
            "QK-Clip would move the parameters of a step that loss scaling skips: use "
            "qk_clip_threshold or loss_scale, not both"
        )
    if pipeline is not None and (record or fused_cross_entropy):
        raise ValueError("a pipeline runs neither QK-Clip's statistics nor fused_cross_entropy")

    def loss_fn(params, batch, key):
        if pipeline is not None:
            return pipeline.batch_loss(params, config, batch, z_loss=z_loss)
        # Pretraining runs without dropout; the key draws MoE router noise only.
        return batch_loss(
            params,
            config,
            batch,
            z_loss=z_loss,
            fused_cross_entropy=fused_cross_entropy,
            max_logits=record,
            key=key if config.router_noise else None,
        )

    update = make_update(
        loss_fn,
        optimizer,
        accum_steps=accum_steps,
        router_bias_rate=config.aux_free_bias_rate,
        loss_scale=loss_scale,
    )

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
        metrics.update({k: v for k, v in m.items() if k.startswith("moe_")})
        metrics.update({k: m[k] for k in ("loss_scale", "skipped") if k in m})
        if pipeline is not None:
            metrics["pipeline_bubble"] = pipeline.bubble()
        if record:
            logit_max = m["attn_logit_max"]
            new_state = new_state.replace(
                params=qk_clip(new_state.params, logit_max, qk_clip_threshold)
            )
            metrics["attn_logit_max"] = jnp.max(logit_max)
            metrics["qk_clipped_heads"] = jnp.sum(logit_max > qk_clip_threshold)
        return new_state, metrics

    return step


def make_eval_step(config: TransformerConfig, *, fused_cross_entropy: bool = False):
    """Returns ``eval_step(params, batch) -> (nll_sum, count)``, not yet jitted: the
    likelihood alone, without a mixture of experts' auxiliary losses (training terms, not a
    property of the model's predictions)."""

    def eval_step(params, batch):
        _, count, metrics = batch_loss(
            params, config, batch, fused_cross_entropy=fused_cross_entropy
        )
        return metrics["nll"], count

    return eval_step
