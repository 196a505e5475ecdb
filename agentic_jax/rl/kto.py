"""Unpaired preference losses: each completion is labelled desirable or undesirable.

KTO needs no pairs, only a thumbs-up / thumbs-down per completion, and a
reference point z₀ ≈ KL(π ‖ π_ref), estimated from mismatched (prompt,
completion) pairs. z₀ is clamped at 0 and detached: it is a baseline, not
something to optimise.
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check

KTO_LOSSES = ("kto", "apo_zero_unpaired")


def kto_reference_point(kl_logps, ref_kl_logps) -> jax.Array:
    """z₀ = sg(max(0, mean(log π − log π_ref))) over mismatched completions.

    Under data parallelism, average the per-shard means (psum / count) before
    passing the result as `reference_point`, as KTO does across devices.
    """
    kl_logps = check.rank("kl_logps", check.floating("kl_logps", kl_logps), 1)
    ref_kl_logps = check.shape(
        "ref_kl_logps", check.floating("ref_kl_logps", ref_kl_logps), kl_logps.shape
    )
    return jax.lax.stop_gradient(jnp.maximum(jnp.mean(kl_logps - ref_kl_logps), 0.0))


def kto_loss(
    logps,
    ref_logps,
    desirable,
    *,
    loss_type: str = "kto",
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
    reference_point=None,
) -> jax.Array:
    """Per-completion losses [B] from summed log-probs [B] and labels `desirable` [B].

    With ρ = log π(y) − log π_ref(y):
      kto:               λ_D·(1 − σ(β(ρ − z₀))) if desirable, λ_U·(1 − σ(β(z₀ − ρ))) otherwise,
                         z₀ = `reference_point` (see `kto_reference_point`), clamped ≥ 0 and detached.
                         Ethayarajh et al. (2024), "KTO", arXiv:2402.01306.
      apo_zero_unpaired: λ_D·(1 − σ(βρ)) if desirable, λ_U·σ(βρ) otherwise.
                         D'Oosterlinck et al. (2024), "Anchored Preference Optimization", arXiv:2408.06266.
    KTO suggests λ_D·n_D / (λ_U·n_U) in [1, 4/3] for imbalanced data.
    """
    check.choice("loss_type", loss_type, KTO_LOSSES)
    check.static_range("beta", beta, 0.0, float("inf"), low_open=True)
    logps = check.rank("logps", check.floating("logps", logps), 1)
    ref_logps = check.shape("ref_logps", check.floating("ref_logps", ref_logps), logps.shape)
    desirable = check.shape("desirable", check.mask("desirable", desirable), logps.shape) > 0
    ratio = logps - ref_logps
    if loss_type == "kto":
        check.required(
            "reference_point", reference_point, "for loss_type='kto' (see kto_reference_point)"
        )
        z0 = jax.lax.stop_gradient(
            jnp.maximum(check.floating("reference_point", reference_point), 0.0)
        )
        desirable_loss = 1.0 - jax.nn.sigmoid(beta * (ratio - z0))
        undesirable_loss = 1.0 - jax.nn.sigmoid(beta * (z0 - ratio))
    else:
        desirable_loss = 1.0 - jax.nn.sigmoid(beta * ratio)
        undesirable_loss = jax.nn.sigmoid(beta * ratio)
    return jnp.where(
        desirable, desirable_weight * desirable_loss, undesirable_weight * undesirable_loss
    )
