"""Off-policy correction for the sampler/trainer mismatch: importance weights from behaviour log-probs.

The tokens of a rollout are sampled by an inference engine (the behaviour policy μ, whose
log-probs the sampler returns) but scored by the trainer (π): different kernels, precision or
a stale policy make μ ≠ π, and the policy gradient E_μ[A·∇log π] is then biased. Importance
weights w ≈ π/μ correct it: E_μ[w·A·∇log π] = E_π[A·∇log π] for w = π/μ, and truncating or
masking large ratios trades a little bias for bounded variance.

The weights multiply the advantages, A_t ← w_t·A_t, before the policy loss. Every token-level
surrogate ℓ_t of `policy_loss` is positively homogeneous in its advantage, ℓ_t(w·A_t) =
w·ℓ_t(A_t) for w ≥ 0 (the clipping branch depends only on the sign of A), so this weights each
token's surrogate term by w_t; the KL and entropy terms are not reweighted. Sequence-level losses
(gspo, geo_mean) average the advantages over a sequence: use `level="sequence"` with them. The
covariance-selected variants (clip_cov, kl_cov) select tokens by their advantages, and kl_cov's
|log ρ| penalty does not scale with A, so for them the product is only approximately a weighting.
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.kl import kl_penalty
from agentic_jax.rl.numerics import LOG_RATIO_CLAMP, safe_div

sg = jax.lax.stop_gradient

IMPORTANCE_METHODS = ("tis", "mis")
IMPORTANCE_LEVELS = ("token", "sequence")


def _check_cap(cap, method):
    check.static_range("cap", cap, 0.0, float("inf"), low_open=True)
    if method == "tis" and isinstance(cap, (int, float)) and cap < 1.0:
        raise ValueError(
            f"cap must be >= 1 for method='tis' (a truncation below 1 would down-weight "
            f"on-policy tokens), got {cap}"
        )


def importance_weights(logp, behaviour_logp, mask, *, method="tis", level="token", cap=2.0):
    """Importance weights [B, T] correcting for the behaviour policy, and mismatch metrics.

    With log ρ_t = clip(log π(y_t) − log μ(y_t), ±20) (`LOG_RATIO_CLAMP`) on valid tokens:
      level="token":    ρ_t = exp(log ρ_t), one ratio per token;
      level="sequence": ρ_t = exp(clip(Σ_s mask_s·log ρ_s, ±20)) for every token of the row,
                        the exact trajectory ratio π(y)/μ(y) (one sequence per row);
      method="tis":     w = min(ρ, C), truncated importance sampling (C = `cap` ≥ 1);
      method="mis":     w = ρ·𝟙[ρ ≤ C], masked importance sampling: tokens (or whole
                        sequences) whose ratio exceeds C are dropped instead of truncated.
    The weights are stop-gradient, 0 on masked tokens, and exactly 1 where logp ==
    behaviour_logp (for a whole row at the sequence level) with C ≥ 1. Multiply the advantages
    by them (see the module docstring). To also drop MIS-rejected tokens from the loss's
    denominator (verl's rejection sampling), use ``mask * (weights > 0)`` as the loss mask:
    ratios are at least e^−20 > 0, so w > 0 exactly on the kept valid tokens.

    `logp` are the trainer's log-probs of the sampled tokens under the rollout's parameters
    (the `old_logp` of the PPO ratio, computed before the update), `behaviour_logp` the sampler's.

    Metrics are plain scalars of this batch (not sums; compute them on the whole batch):
      mismatch_mean, mismatch_max: mean and max |log ρ_t| over valid tokens (clamped to 20);
      mismatch_kl:     mean k3 estimate of KL(μ‖π) over valid tokens;
      ess:             (Σ w)² / (n·Σ w²) over the n units (valid tokens, or non-empty rows at
                       the sequence level): the normalised effective sample size, in (0, 1],
                       1 for equal weights; 0 when every weight is 0;
      capped_fraction: fraction of units with ρ > C (truncated by tis, dropped by mis);
      weight_mean:     mean weight over the units.
    Yao et al. (2025), "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training"
    (TIS; blog, fengyao.notion.site/off-policy-rl); MIS and sequence-level ratios: Liu, Li et al.
    (2025), "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
    Mismatch" (blog), as in verl's rollout correction; ratio truncation: Espeholt et al. (2018),
    "IMPALA" (V-trace), arXiv:1802.01561.
    """
    check.choice("method", method, IMPORTANCE_METHODS)
    check.choice("level", level, IMPORTANCE_LEVELS)
    _check_cap(cap, method)
    logp = check.rank("logp", check.floating("logp", logp), 2)
    behaviour_logp = check.floating("behaviour_logp", behaviour_logp)
    behaviour_logp = check.shape("behaviour_logp", behaviour_logp, logp.shape)
    mask = check.shape("mask", check.mask("mask", mask), logp.shape)
    valid = mask > 0
    # Masked entries may be -inf or NaN: zero them before any arithmetic.
    logp = sg(jnp.where(valid, logp, 0.0))
    behaviour_logp = sg(jnp.where(valid, behaviour_logp, 0.0))
    log_ratio = jnp.clip(logp - behaviour_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)

    if level == "token":
        unit_log_ratio, units = log_ratio, valid
    else:
        sequence = jnp.clip(jnp.sum(log_ratio, axis=1), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        unit_log_ratio, units = sequence, jnp.any(valid, axis=1)
    ratio = jnp.exp(unit_log_ratio)
    capped = ratio > cap
    unit_weights = jnp.minimum(ratio, cap) if method == "tis" else jnp.where(capped, 0.0, ratio)
    unit_weights = jnp.where(units, unit_weights, 0.0)
    weights = unit_weights if level == "token" else unit_weights[:, None]
    weights = sg(jnp.where(valid, weights, 0.0))

    tokens, count = jnp.sum(mask), jnp.sum(units.astype(jnp.float32))
    mismatch = jnp.where(valid, jnp.abs(log_ratio), 0.0)
    total, squares = jnp.sum(unit_weights), jnp.sum(jnp.square(unit_weights))
    metrics = {
        "mismatch_mean": safe_div(jnp.sum(mismatch), tokens),
        "mismatch_max": jnp.max(mismatch),
        "mismatch_kl": safe_div(
            jnp.sum(jnp.where(valid, kl_penalty(behaviour_logp, logp, "k3"), 0.0)), tokens
        ),
        "ess": safe_div(jnp.square(total), count * squares),
        "capped_fraction": safe_div(jnp.sum(units & capped), count),
        "weight_mean": safe_div(total, count),
    }
    return weights, metrics
