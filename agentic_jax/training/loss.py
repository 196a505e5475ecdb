"""Next-token cross-entropy with loss masks and z-loss, kept as (sum, count) for exact reduction."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits, targets, mask, *, z_loss: float = 0.0):
    """Masked softmax cross-entropy plus the PaLM z-loss ``z_loss * log(Z)^2`` (Chowdhery et al. 2022).

    Returns ``(total, count, metrics)``: the masked sums, so that micro-batches and data-parallel
    shards add up before the single division ``total / count``.  ``metrics["nll"]`` is the
    cross-entropy part of ``total`` alone.
    """
    if logits.shape[:-1] != targets.shape or targets.shape != mask.shape:
        raise ValueError(
            f"logits {logits.shape[:-1]}+[V], targets {targets.shape} and mask {mask.shape} "
            "must share leading shape"
        )
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[
        ..., 0
    ]
    nll = log_z - target_logit
    mask = mask.astype(jnp.float32)
    nll_sum = jnp.sum(nll * mask)
    total = nll_sum + z_loss * jnp.sum(jnp.square(log_z) * mask)
    return total, jnp.sum(mask), {"nll": nll_sum}
