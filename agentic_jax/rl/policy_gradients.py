"""Token-level policy-gradient losses for LLM RL, one `loss_type` per published variant.

All variants share the same inputs (current, rollout-time and optionally
reference log-probs of the sampled tokens, advantages, a validity mask) and the
same output, a `LossOutput` whose sums and counts reduce exactly across
micro-batches and shards. Log-ratios are clamped to ±20 before `exp`.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.aggregation import aggregate, segment_mean
from agentic_jax.rl.kl import KL_ESTIMATORS, kl_penalty
from agentic_jax.rl.numerics import LOG_RATIO_CLAMP
from agentic_jax.rl.types import LossOutput

sg = jax.lax.stop_gradient

DAPO_EPSILON_HIGH = 0.28

DEFAULT_AGGREGATION = {
    "ppo": "token-mean",
    "grpo": "seq-mean-token-mean",
    "bnpo": "token-mean",
    "dr_grpo": "seq-mean-token-sum-norm",
    "dapo": "token-mean",
    "gspo": "seq-mean-token-mean",
    "gspo_token": "seq-mean-token-mean",
    "cispo": "token-mean",
    "sapo": "seq-mean-token-mean",
    "gpg": "token-mean",
    "geo_mean": "seq-mean-token-mean",
    "clip_cov": "token-mean",
    "kl_cov": "token-mean",
}
POLICY_LOSSES = tuple(DEFAULT_AGGREGATION)


class _Inputs(NamedTuple):
    logp: jax.Array
    adv: jax.Array
    mask: jax.Array
    segment_ids: jax.Array | None
    log_ratio: jax.Array
    ratio: jax.Array
    eps_low: float
    eps_high: float
    dual_clip: float | None
    tau_pos: float
    tau_neg: float
    cov_fraction: float
    clip_cov_bounds: tuple[float, float]
    kl_cov_coef: float
    key: jax.Array | None

    def seq_mean(self, x):
        return segment_mean(x, self.mask, self.segment_ids)


def _clipped(x: _Inputs, ratio, adv):
    """max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)): the pessimistic PPO surrogate."""
    return jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - x.eps_low, 1.0 + x.eps_high))


def _ppo(x: _Inputs):
    """Clipped surrogate, with dual clip: for A < 0 the loss is capped at −c·A.

    Schulman et al. (2017), arXiv:1707.06347; dual clip: Ye et al. (2020), arXiv:1912.09729.
    """
    loss = _clipped(x, x.ratio, x.adv)
    if x.dual_clip is not None:
        loss = jnp.where(x.adv < 0, jnp.minimum(loss, -x.adv * x.dual_clip), loss)
    return loss, x.ratio


def _token_clip(x: _Inputs):
    """Clipped surrogate per token; grpo / bnpo / dr_grpo / dapo differ in aggregation and ε_high."""
    return _clipped(x, x.ratio, x.adv), x.ratio


def _gspo(x: _Inputs):
    """Sequence ratio s = exp(mean_t log ρ_t), clipped, with the sequence advantage.

    Zheng et al. (2025), "Group Sequence Policy Optimization", arXiv:2507.18071.
    """
    ratio = jnp.exp(x.seq_mean(x.log_ratio))
    return _clipped(x, ratio, x.seq_mean(x.adv)), ratio


def _gspo_token(x: _Inputs):
    """GSPO-token: s_t = sg[s]·π(y_t)/sg[π(y_t)], allowing per-token advantages (same paper)."""
    ratio = jnp.exp(sg(x.seq_mean(x.log_ratio)) + x.logp - sg(x.logp))
    return _clipped(x, ratio, x.adv), ratio


def _cispo(x: _Inputs):
    """−sg[clip(ρ)]·A·log π: clips the importance weight, never a token's gradient.

    MiniMax (2025), "MiniMax-M1", arXiv:2506.13585.
    """
    weight = sg(jnp.clip(x.ratio, 1.0 - x.eps_low, 1.0 + x.eps_high))
    return -weight * x.adv * x.logp, x.ratio


def _sapo(x: _Inputs):
    """−(4/τ)·σ(τ(ρ − 1))·A: a smooth gate instead of a hard clip; τ by the sign of A.

    Gao et al. (2025), "Soft Adaptive Policy Optimization", arXiv:2511.20347.
    """
    tau = jnp.where(x.adv > 0, x.tau_pos, x.tau_neg)
    return -jax.nn.sigmoid(tau * (x.ratio - 1.0)) * (4.0 / tau) * x.adv, x.ratio


def _gpg(x: _Inputs):
    """−A·log π: plain policy gradient, no ratio and no clip.

    Chu et al. (2025), "GPG: A Simple and Strong RL Baseline", arXiv:2504.02546.
    """
    return -x.adv * x.logp, x.ratio


def _geo_mean(x: _Inputs):
    """−Ā·exp(mean_t clip_A(log ρ_t)): geometric instead of arithmetic mean of token ratios.

    Log-ratios are clipped to [−ε_low, ε_high] in the direction of the advantage.
    Zhao et al. (2025), "Geometric-Mean Policy Optimization", arXiv:2507.20673.
    """
    sign = jnp.sign(x.adv)
    clipped = jnp.clip(x.log_ratio, -x.eps_low, x.eps_high)
    log_ratio = sign * jnp.minimum(sign * x.log_ratio, sign * clipped)
    ratio = jnp.exp(x.seq_mean(log_ratio))
    return -x.seq_mean(x.adv) * ratio, ratio


def _covariance(x: _Inputs):
    """Per-token centred covariance (A − Ā)·(log π − mean log π) over the batch's valid tokens."""
    count = jnp.maximum(jnp.sum(x.mask), 1.0)
    logp = sg(x.logp)
    adv_mean = jnp.sum(x.adv * x.mask) / count
    logp_mean = jnp.sum(logp * x.mask) / count
    return (x.adv - adv_mean) * (logp - logp_mean)


def _top_fraction(priority, eligible, fraction, valid):
    """Marks the max(1, ⌊fraction·n_valid⌋) eligible entries of highest priority.

    The fraction is of the batch's valid tokens, not of its padded size (as in the paper and
    verl), so padding does not change how many tokens are selected.  The count is traced, so
    the top ⌊fraction·size⌋ (a static bound) are ranked and those of rank < count are kept.
    """
    bound = max(1, int(fraction * priority.size))
    count = jnp.maximum(1.0, jnp.floor(fraction * jnp.sum(valid)))
    flat = jnp.where(eligible, priority, -jnp.inf).ravel()
    _, index = jax.lax.top_k(flat, bound)
    chosen = jnp.zeros(flat.shape, bool).at[index].set(jnp.arange(bound) < count)
    return (chosen & eligible.ravel()).reshape(priority.shape)


def _clip_cov(x: _Inputs):
    """Clipped surrogate, plus no gradient (zero loss) for a fraction of high-covariance tokens.

    Among unclipped tokens with covariance in `clip_cov_bounds`, ⌊cov_fraction·n_valid⌋
    (n_valid: the batch's valid tokens) are detached, drawn at random with `key` (as in the paper) or
    by highest covariance without one. Cui et al. (2025), "The Entropy Mechanism
    of RL for Reasoning LMs", arXiv:2505.22617.
    """
    loss = _clipped(x, x.ratio, x.adv)
    clipped = -x.adv * jnp.clip(x.ratio, 1.0 - x.eps_low, 1.0 + x.eps_high) > -x.adv * x.ratio
    cov = _covariance(x)
    low, high = x.clip_cov_bounds
    eligible = (x.mask > 0) & ~clipped & (cov > low) & (cov < high)
    priority = cov if x.key is None else jax.random.uniform(x.key, cov.shape)
    return jnp.where(
        _top_fraction(priority, eligible, x.cov_fraction, x.mask > 0), 0.0, loss
    ), x.ratio


def _kl_cov(x: _Inputs):
    """−A·ρ, plus kl_cov_coef·|log ρ| on the fraction `cov_fraction` of valid tokens of highest covariance.

    Cui et al. (2025), arXiv:2505.22617.
    """
    selected = _top_fraction(_covariance(x), x.mask > 0, x.cov_fraction, x.mask > 0)
    return -x.adv * x.ratio + jnp.where(
        selected, x.kl_cov_coef * jnp.abs(x.log_ratio), 0.0
    ), x.ratio


_LOSSES = {
    "ppo": _ppo,
    "grpo": _token_clip,
    "bnpo": _token_clip,
    "dr_grpo": _token_clip,
    "dapo": _token_clip,
    "gspo": _gspo,
    "gspo_token": _gspo_token,
    "cispo": _cispo,
    "sapo": _sapo,
    "gpg": _gpg,
    "geo_mean": _geo_mean,
    "clip_cov": _clip_cov,
    "kl_cov": _kl_cov,
}


def _token_array(name, x, shape, valid):
    """float32 [B, T] with masked entries zeroed, so that -inf padding cannot leak NaNs."""
    x = check.shape(name, check.floating(name, x), shape)
    return jnp.where(valid, x, 0.0)


def policy_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    loss_type: str = "grpo",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    dual_clip: float | None = 3.0,
    ref_logp=None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy=None,
    entropy_coef: float = 0.0,
    aggregation: str | None = None,
    max_length: int | None = None,
    segment_ids=None,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    cov_fraction: float = 2e-4,
    clip_cov_bounds: tuple[float, float] = (1.0, 5.0),
    kl_cov_coef: float = 1.0,
    key=None,
) -> LossOutput:
    """Policy-gradient loss over sampled tokens: `LossOutput(total, count, metrics)`.

    Inputs are [B, T]: `logp` (current policy), `old_logp` (rollout policy),
    `mask`; `advantages` is [B] (one per sequence) or [B, T]. With
    ρ_t = exp(clip(log π − log π_old, ±20)) and A the (never differentiated) advantage,
    the per-token loss ℓ_t is (see each variant's docstring and docs/rl_losses.md):
      ppo        max(−Aρ, −A·clip(ρ, 1−ε, 1+ε_high)), capped at −c·A for A < 0 (dual_clip c)
      grpo       clipped surrogate, seq-mean-token-mean (Shao et al. 2024, arXiv:2402.03300)
      bnpo       clipped surrogate, token-mean over the batch (Xiao et al. 2025, arXiv:2506.02864)
      dr_grpo    clipped surrogate, token sums / fixed max_length (Liu et al. 2025, arXiv:2503.20783)
      dapo       clipped surrogate, ε_high = 0.28 by default, token-mean (Yu et al. 2025, arXiv:2503.14476)
      gspo       sequence-level ratio; gspo_token its per-token-advantage form
      cispo      −sg[clip(ρ)]·A·log π;  sapo: −(4/τ)σ(τ(ρ−1))·A;  gpg: −A·log π
      geo_mean   −Ā·exp(mean_t clipped log ρ_t) (GMPO)
      clip_cov / kl_cov   covariance-selected detach / KL penalty (Cui et al. 2025)
    then ℓ_t += kl_coef·KL_t (if `ref_logp`, estimator `kl_estimator`) and
    ℓ_t −= entropy_coef·entropy_t (if `entropy`), and ℓ is reduced by
    `aggregate` with `aggregation` (default per loss_type: `DEFAULT_AGGREGATION`).
    `epsilon_high` defaults to `epsilon` (0.28 for dapo); `segment_ids` marks
    packed sequences; `key` randomises clip_cov's selection.

    Metrics are token sums (see `LossOutput.metric_means`): clip_frac_low
    (A < 0, ρ < 1 − ε), clip_frac_high (A > 0, ρ > 1 + ε_high), approx_kl
    (k3 estimate of KL(π_old‖π)), ratio, ratio_min, ratio_max, and kl /
    entropy when given.
    """
    check.choice("loss_type", loss_type, POLICY_LOSSES)
    aggregation = DEFAULT_AGGREGATION[loss_type] if aggregation is None else aggregation
    check.choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    check.static_range("epsilon", epsilon, 0.0, float("inf"))
    if epsilon_high is None:
        epsilon_high = DAPO_EPSILON_HIGH if loss_type == "dapo" else epsilon
    check.static_range("epsilon_high", epsilon_high, 0.0, float("inf"))
    if dual_clip is not None:
        check.static_range("dual_clip", dual_clip, 1.0, float("inf"), low_open=True)
    check.static_range("sapo_tau_pos", sapo_tau_pos, 0.0, float("inf"), low_open=True)
    check.static_range("sapo_tau_neg", sapo_tau_neg, 0.0, float("inf"), low_open=True)
    check.static_range("cov_fraction", cov_fraction, 0.0, 1.0, low_open=True)
    if isinstance(kl_coef, (int, float)) and kl_coef != 0.0:
        check.required("ref_logp", ref_logp, f"when kl_coef is non-zero (got kl_coef={kl_coef})")

    logp = check.rank("logp", check.floating("logp", logp), 2)
    mask = check.shape("mask", check.mask("mask", mask), logp.shape)
    valid = mask > 0
    logp = jnp.where(valid, logp, 0.0)
    old_logp = sg(_token_array("old_logp", old_logp, logp.shape, valid))
    advantages = check.floating("advantages", advantages)
    if advantages.ndim == 1 and segment_ids is not None:
        raise ValueError(
            "advantages must be per token [B, T] with segment_ids (a packed row holds several sequences)"
        )
    if advantages.ndim == 1:
        advantages = jnp.broadcast_to(
            check.shape("advantages", advantages, logp.shape[:1])[:, None], logp.shape
        )
    advantages = sg(_token_array("advantages", advantages, logp.shape, valid))
    if segment_ids is not None:
        segment_ids = check.shape(
            "segment_ids", check.integer("segment_ids", segment_ids), logp.shape
        )

    log_ratio = jnp.clip(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    inputs = _Inputs(
        logp=logp,
        adv=advantages,
        mask=mask,
        segment_ids=segment_ids,
        log_ratio=log_ratio,
        ratio=jnp.exp(log_ratio),
        eps_low=epsilon,
        eps_high=epsilon_high,
        dual_clip=dual_clip,
        tau_pos=sapo_tau_pos,
        tau_neg=sapo_tau_neg,
        cov_fraction=cov_fraction,
        clip_cov_bounds=clip_cov_bounds,
        kl_cov_coef=kl_cov_coef,
        key=key,
    )
    per_token, ratio = _LOSSES[loss_type](inputs)

    ratio = sg(ratio)
    metrics = {
        "tokens": jnp.sum(mask),
        "clip_frac_low": jnp.sum(mask * ((advantages < 0) & (ratio < 1.0 - epsilon))),
        "clip_frac_high": jnp.sum(mask * ((advantages > 0) & (ratio > 1.0 + epsilon_high))),
        "approx_kl": jnp.sum(mask * sg(kl_penalty(old_logp, logp, "k3"))),
        "ratio": jnp.sum(mask * ratio),
        # Ratios lie in [0, e^20], so these identities keep the reduction exact.
        "ratio_min": jnp.min(jnp.where(valid, ratio, jnp.exp(LOG_RATIO_CLAMP))),
        "ratio_max": jnp.max(jnp.where(valid, ratio, 0.0)),
    }
    if ref_logp is not None:
        kl = kl_penalty(logp, _token_array("ref_logp", ref_logp, logp.shape, valid), kl_estimator)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = jnp.sum(mask * sg(kl))
    if entropy is not None:
        entropy = _token_array("entropy", entropy, logp.shape, valid)
        per_token = per_token - entropy_coef * entropy
        metrics["entropy"] = jnp.sum(mask * sg(entropy))

    total, count = aggregate(
        per_token, mask, aggregation, segment_ids=segment_ids, max_length=max_length
    )
    return LossOutput(total, count, metrics)
