"""Policy-gradient losses: per-step losses of one stream, and token-level losses for LLM RL.

Single stream (rlax conventions, one trajectory [T]; `jax.vmap` for batches):
`reinforce_loss`, `clipped_surrogate_loss`, `entropy_loss`.

Token level: one public function per published variant (`ppo_loss`, `grpo_loss`, ...,
`kl_cov_loss`), each taking its own hyperparameters and the arguments every variant shares,
and `policy_loss(loss_type=...)`, a dispatcher over the one table `POLICY_LOSS_FUNCTIONS`.
Every variant takes the same inputs (current, rollout-time and optionally reference
log-probs of the sampled tokens, advantages, a validity mask) and returns a `LossOutput`
whose sums and counts reduce exactly across micro-batches and shards. Log-ratios are clamped
to ±20 before `exp`.
"""

import functools
import inspect
from typing import NamedTuple

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.aggregation import aggregate, segment_mean
from agentic_jax.rl.kl import KL_ESTIMATORS, kl_penalty
from agentic_jax.rl.numerics import LOG_RATIO_CLAMP, expectation
from agentic_jax.rl.types import LossOutput

sg = jax.lax.stop_gradient

DAPO_EPSILON_HIGH = 0.28

# --- Single stream ---------------------------------------------------------------------------


def reinforce_loss(logp_t, return_t, baseline_t=None) -> jax.Array:
    """−log π(a_t|s_t)·(G_t − b_t) per step, with (G_t − b_t) not differentiated.

    A baseline leaves the gradient unbiased and lowers its variance; train the
    baseline with its own regression loss. Williams (1992), "Simple statistical
    gradient-following algorithms for connectionist RL".
    """
    baseline_t = (
        jnp.zeros_like(jnp.asarray(return_t, jnp.float32)) if baseline_t is None else baseline_t
    )
    logp_t, return_t, baseline_t = check.stream(
        logp_t=logp_t, return_t=return_t, baseline_t=baseline_t
    )
    return -logp_t * sg(return_t - baseline_t)


def entropy_loss(logits_t) -> jax.Array:
    """−H(π(·|s_t)) per step from logits [..., A]; add with a small coefficient.

    Maximising entropy delays premature collapse of the policy. Actions masked out with −inf
    logits count as 0·log 0 = 0 (not NaN), in the value and the gradient.
    Williams & Peng (1991); Mnih et al. (2016), "Asynchronous Methods for Deep RL", arXiv:1602.01783.
    """
    logits_t = check.floating("logits_t", logits_t)
    log_probs = jax.nn.log_softmax(logits_t, axis=-1)
    return expectation(log_probs, log_probs)


def clipped_surrogate_loss(ratio_t, adv_t, epsilon: float = 0.2) -> jax.Array:
    """−min(ρ_t·A_t, clip(ρ_t, 1 − ε, 1 + ε)·A_t) per step; advantages not differentiated.

    Schulman et al. (2017), "Proximal Policy Optimization Algorithms", arXiv:1707.06347.
    """
    ratio_t, adv_t = check.stream(ratio_t=ratio_t, adv_t=adv_t)
    adv_t = sg(adv_t)
    return -jnp.minimum(ratio_t * adv_t, jnp.clip(ratio_t, 1.0 - epsilon, 1.0 + epsilon) * adv_t)


# --- Token level: shared inputs and output ----------------------------------------------------


class _Tokens(NamedTuple):
    """Validated [B, T] inputs of a token-level loss (masked entries zeroed)."""

    logp: jax.Array
    old_logp: jax.Array
    adv: jax.Array
    mask: jax.Array
    segment_ids: jax.Array | None
    log_ratio: jax.Array
    ratio: jax.Array
    eps_low: float
    eps_high: float

    def seq_mean(self, x):
        return segment_mean(x, self.mask, self.segment_ids)


def _token_array(name, x, shape, valid):
    """float32 [B, T] with masked entries zeroed, so that -inf padding cannot leak NaNs."""
    x = check.shape(name, check.floating(name, x), shape)
    return jnp.where(valid, x, 0.0)


def _tokens(logp, old_logp, advantages, mask, segment_ids, epsilon, epsilon_high) -> _Tokens:
    """Checks and prepares the inputs every variant shares; `epsilon_high=None` means ε."""
    check.static_range("epsilon", epsilon, 0.0, float("inf"))
    epsilon_high = epsilon if epsilon_high is None else epsilon_high
    check.static_range("epsilon_high", epsilon_high, 0.0, float("inf"))
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
    return _Tokens(
        logp=logp,
        old_logp=old_logp,
        adv=advantages,
        mask=mask,
        segment_ids=segment_ids,
        log_ratio=log_ratio,
        ratio=jnp.exp(log_ratio),
        eps_low=epsilon,
        eps_high=epsilon_high,
    )


def _output(
    x: _Tokens,
    per_token,
    ratio,
    *,
    aggregation,
    max_length,
    ref_logp,
    kl_coef,
    kl_estimator,
    entropy,
    entropy_coef,
) -> LossOutput:
    """Adds the KL and entropy terms to ℓ_t, computes the metrics and aggregates."""
    check.choice("kl_estimator", kl_estimator, KL_ESTIMATORS)
    if isinstance(kl_coef, (int, float)) and kl_coef != 0.0:
        check.required("ref_logp", ref_logp, f"when kl_coef is non-zero (got kl_coef={kl_coef})")
    mask, valid = x.mask, x.mask > 0
    ratio = sg(ratio)
    metrics = {
        "tokens": jnp.sum(mask),
        "clip_frac_low": jnp.sum(mask * ((x.adv < 0) & (ratio < 1.0 - x.eps_low))),
        "clip_frac_high": jnp.sum(mask * ((x.adv > 0) & (ratio > 1.0 + x.eps_high))),
        "approx_kl": jnp.sum(mask * sg(kl_penalty(x.old_logp, x.logp, "k3"))),
        "ratio": jnp.sum(mask * ratio),
        # Ratios lie in [0, e^20], so these identities keep the reduction exact.
        "ratio_min": jnp.min(jnp.where(valid, ratio, jnp.exp(LOG_RATIO_CLAMP))),
        "ratio_max": jnp.max(jnp.where(valid, ratio, 0.0)),
    }
    if ref_logp is not None:
        ref_logp = _token_array("ref_logp", ref_logp, x.logp.shape, valid)
        kl = kl_penalty(x.logp, ref_logp, kl_estimator)
        per_token = per_token + kl_coef * kl
        metrics["kl"] = jnp.sum(mask * sg(kl))
    if entropy is not None:
        entropy = _token_array("entropy", entropy, x.logp.shape, valid)
        per_token = per_token - entropy_coef * entropy
        metrics["entropy"] = jnp.sum(mask * sg(entropy))
    total, count = aggregate(
        per_token, mask, aggregation, segment_ids=x.segment_ids, max_length=max_length
    )
    return LossOutput(total, count, metrics)


def _clipped(x: _Tokens, ratio, adv):
    """max(−A·ρ, −A·clip(ρ, 1 − ε_low, 1 + ε_high)): the pessimistic PPO surrogate."""
    return jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, 1.0 - x.eps_low, 1.0 + x.eps_high))


_ARRAYS = ("logp", "old_logp", "advantages", "mask")


def _shared_options(
    *,
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    aggregation: str = "token-mean",
    max_length: int | None = None,
    segment_ids=None,
    ref_logp=None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy=None,
    entropy_coef: float = 0.0,
):
    """The keyword arguments every token-level loss takes (documented in `policy_loss`)."""


_SHARED = tuple(inspect.signature(_shared_options).parameters.values())
_TOKENS_OPTIONS = ("epsilon", "epsilon_high", "segment_ids")  # the shared options `_tokens` takes


def _token_loss(aggregation: str, *, epsilon_high_if_none: float | None = None):
    """Makes a variant's public loss from its core ``core(x: _Tokens, **own) -> (ℓ_t, ratio)``.

    The public function takes ``logp, old_logp, advantages, mask``, the core's own keyword
    arguments and the shared ones (`_shared_options`, with ``aggregation`` defaulting to the
    variant's); its signature says exactly that, so `policy_loss` and ``help()`` read it.  It
    validates the inputs (`_tokens`), runs the core, then adds the KL and entropy terms, computes
    the metrics and aggregates (`_output`).  ``epsilon_high_if_none``: what ``epsilon_high=None``
    means for this variant (DAPO's clip-higher default); otherwise ε.
    """

    def make(core):
        own = [p for name, p in inspect.signature(core).parameters.items() if name != "x"]
        shared = [p.replace(default=aggregation) if p.name == "aggregation" else p for p in _SHARED]
        arrays = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in _ARRAYS]
        signature = inspect.Signature([*arrays, *own, *shared], return_annotation=LossOutput)

        @functools.wraps(core)
        def loss(*args, **kwargs) -> LossOutput:
            bound = signature.bind(*args, **kwargs)  # a TypeError names a wrong argument
            bound.apply_defaults()
            a = bound.arguments
            high = a["epsilon_high"]
            x = _tokens(
                *(a[n] for n in _ARRAYS),
                a["segment_ids"],
                a["epsilon"],
                epsilon_high_if_none if high is None else high,
            )
            per_token, ratio = core(x, **{p.name: a[p.name] for p in own})
            return _output(
                x,
                per_token,
                ratio,
                **{p.name: a[p.name] for p in _SHARED if p.name not in _TOKENS_OPTIONS},
            )

        loss.__signature__ = signature
        return loss

    return make


# --- Token level: one function per variant ----------------------------------------------------
#
# Each takes logp, old_logp, mask [B, T] and advantages [B] or [B, T], its own hyperparameters
# and the shared options (`_shared_options`); see `_token_loss`.


def _surrogate(x: _Tokens):
    return _clipped(x, x.ratio, x.adv), x.ratio


@_token_loss("token-mean")
def ppo_loss(x: _Tokens, *, dual_clip: float | None = 3.0):
    """PPO's clipped surrogate, with dual clip: ℓ_t = max(−Aρ, −A·clip(ρ, 1 − ε, 1 + ε_high)),
    and min(ℓ_t, −c·A) for A < 0 (`dual_clip` c > 1, None for none); token-mean.

    Schulman et al. (2017), "Proximal Policy Optimization Algorithms", arXiv:1707.06347;
    dual clip: Ye et al. (2020), "Mastering Complex Control in MOBA Games", arXiv:1912.09729.
    """
    loss, ratio = _surrogate(x)
    if dual_clip is not None:
        check.static_range("dual_clip", dual_clip, 1.0, float("inf"), low_open=True)
        loss = jnp.where(x.adv < 0, jnp.minimum(loss, -x.adv * dual_clip), loss)
    return loss, ratio


@_token_loss("seq-mean-token-mean")
def grpo_loss(x: _Tokens):
    """GRPO: ℓ_t = max(−Aρ, −A·clip(ρ, 1 − ε, 1 + ε_high)), averaged per sequence, then over
    sequences (seq-mean-token-mean); the KL term usually comes with `ref_logp`, `kl_coef`.

    Shao et al. (2024), "DeepSeekMath", arXiv:2402.03300.
    """
    return _surrogate(x)


@_token_loss("token-mean")
def bnpo_loss(x: _Tokens):
    """BNPO: ℓ_t = max(−Aρ, −A·clip(ρ, 1 − ε, 1 + ε_high)), normalised over the batch's tokens
    (token-mean).

    Xiao et al. (2025), "BNPO: Beta Normalization Policy Optimization", arXiv:2506.02864.
    """
    return _surrogate(x)


@_token_loss("seq-mean-token-sum-norm")
def dr_grpo_loss(x: _Tokens):
    """Dr. GRPO: ℓ_t = max(−Aρ, −A·clip(ρ, 1 − ε, 1 + ε_high)), token sums divided by a fixed
    `max_length` (default T) per sequence (seq-mean-token-sum-norm): no length bias.

    Liu et al. (2025), "Understanding R1-Zero-Like Training", arXiv:2503.20783.
    """
    return _surrogate(x)


@_token_loss("token-mean", epsilon_high_if_none=DAPO_EPSILON_HIGH)
def dapo_loss(x: _Tokens):
    """DAPO: ℓ_t = max(−Aρ, −A·clip(ρ, 1 − ε, 1 + ε_high)) with a decoupled upper clip
    ("clip-higher": `epsilon_high` None means `DAPO_EPSILON_HIGH` = 0.28), token-mean.

    Yu et al. (2025), "DAPO: An Open-Source LLM RL System at Scale", arXiv:2503.14476.
    """
    return _surrogate(x)


@_token_loss("seq-mean-token-mean")
def gspo_loss(x: _Tokens):
    """GSPO: one ratio per sequence, s = exp(mean_t log ρ_t), clipped, with the sequence
    advantage Ā: ℓ = max(−Ā·s, −Ā·clip(s, 1 − ε, 1 + ε_high)); the `ratio` metrics are of s.

    Zheng et al. (2025), "Group Sequence Policy Optimization", arXiv:2507.18071.
    """
    ratio = jnp.exp(x.seq_mean(x.log_ratio))
    return _clipped(x, ratio, x.seq_mean(x.adv)), ratio


@_token_loss("seq-mean-token-mean")
def gspo_token_loss(x: _Tokens):
    """GSPO-token: ℓ_t = max(−A_t·s_t, −A_t·clip(s_t, 1 − ε, 1 + ε_high)) with
    s_t = sg[s]·π(y_t)/sg[π(y_t)] (the value of GSPO's sequence ratio s, the gradient of one
    token), allowing per-token advantages; equals GSPO when A is constant over a sequence.

    Zheng et al. (2025), "Group Sequence Policy Optimization", arXiv:2507.18071.
    """
    ratio = jnp.exp(sg(x.seq_mean(x.log_ratio)) + x.logp - sg(x.logp))
    return _clipped(x, ratio, x.adv), ratio


@_token_loss("token-mean")
def cispo_loss(x: _Tokens):
    """CISPO: ℓ_t = −sg[clip(ρ, 1 − ε, 1 + ε_high)]·A·log π — clips the importance weight,
    never a token's gradient; token-mean.

    MiniMax (2025), "MiniMax-M1: Scaling Test-Time Compute Efficiently", arXiv:2506.13585.
    """
    weight = sg(jnp.clip(x.ratio, 1.0 - x.eps_low, 1.0 + x.eps_high))
    return -weight * x.adv * x.logp, x.ratio


@_token_loss("seq-mean-token-mean")
def sapo_loss(x: _Tokens, *, sapo_tau_pos: float = 1.0, sapo_tau_neg: float = 1.05):
    """SAPO: ℓ_t = −(4/τ)·σ(τ(ρ − 1))·A, a smooth gate instead of a hard clip, with
    τ = `sapo_tau_pos` if A > 0 else `sapo_tau_neg` (both > 0); ε, ε_high only set the
    clip_frac metrics.

    Gao et al. (2025), "Soft Adaptive Policy Optimization", arXiv:2511.20347.
    """
    check.static_range("sapo_tau_pos", sapo_tau_pos, 0.0, float("inf"), low_open=True)
    check.static_range("sapo_tau_neg", sapo_tau_neg, 0.0, float("inf"), low_open=True)
    tau = jnp.where(x.adv > 0, sapo_tau_pos, sapo_tau_neg)
    return -jax.nn.sigmoid(tau * (x.ratio - 1.0)) * (4.0 / tau) * x.adv, x.ratio


@_token_loss("token-mean")
def gpg_loss(x: _Tokens):
    """GPG: ℓ_t = −A·log π, the plain policy gradient, no ratio and no clip (ε, ε_high only
    set the clip_frac metrics); token-mean.

    Chu et al. (2025), "GPG: A Simple and Strong RL Baseline", arXiv:2504.02546.
    """
    return -x.adv * x.logp, x.ratio


@_token_loss("seq-mean-token-mean")
def geo_mean_loss(x: _Tokens):
    """GMPO: ℓ = −Ā·exp(mean_t clip_A(log ρ_t)), the geometric instead of the arithmetic mean
    of token ratios; log ρ_t is clipped to [−ε, ε_high] on the side the advantage pushes it
    (above for A > 0, below for A < 0). The `ratio` metrics are of the sequence ratio.

    Zhao et al. (2025), "Geometric-Mean Policy Optimization", arXiv:2507.20673.
    """
    sign = jnp.sign(x.adv)
    clipped = jnp.clip(x.log_ratio, -x.eps_low, x.eps_high)
    ratio = jnp.exp(x.seq_mean(sign * jnp.minimum(sign * x.log_ratio, sign * clipped)))
    return -x.seq_mean(x.adv) * ratio, ratio


def _covariance(x: _Tokens):
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


@_token_loss("token-mean")
def clip_cov_loss(
    x: _Tokens,
    *,
    cov_fraction: float = 2e-4,
    clip_cov_bounds: tuple[float, float] = (1.0, 5.0),
    key=None,
):
    """Clip-Cov: ℓ_t = max(−Aρ, −A·clip(ρ, 1 − ε, 1 + ε_high)), the clipped surrogate, and
    ℓ_t = 0 (no gradient) on a fraction of high-covariance tokens; token-mean.

    Among the unclipped valid tokens whose covariance (A − Ā)·(log π − mean log π) lies in
    `clip_cov_bounds`, max(1, ⌊`cov_fraction`·n_valid⌋) (n_valid: the batch's valid tokens)
    are detached, drawn at random with `key` (as in the paper) or by highest covariance
    without one. The selection is over the whole batch, so micro-batches do not reduce exactly.
    Cui et al. (2025), "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617.
    """
    check.static_range("cov_fraction", cov_fraction, 0.0, 1.0, low_open=True)
    loss, ratio = _surrogate(x)
    clipped = -x.adv * jnp.clip(x.ratio, 1.0 - x.eps_low, 1.0 + x.eps_high) > -x.adv * x.ratio
    cov = _covariance(x)
    low, high = clip_cov_bounds
    eligible = (x.mask > 0) & ~clipped & (cov > low) & (cov < high)
    priority = cov if key is None else jax.random.uniform(key, cov.shape)
    detached = _top_fraction(priority, eligible, cov_fraction, x.mask > 0)
    return jnp.where(detached, 0.0, loss), ratio


@_token_loss("token-mean")
def kl_cov_loss(x: _Tokens, *, cov_fraction: float = 2e-4, kl_cov_coef: float = 1.0):
    """KL-Cov: ℓ_t = −Aρ + `kl_cov_coef`·|log ρ| on the max(1, ⌊`cov_fraction`·n_valid⌋) valid
    tokens of highest covariance (A − Ā)·(log π − mean log π), −Aρ elsewhere; token-mean
    (ε, ε_high only set the clip_frac metrics). The selection is over the whole batch.

    Cui et al. (2025), "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617.
    """
    check.static_range("cov_fraction", cov_fraction, 0.0, 1.0, low_open=True)
    selected = _top_fraction(_covariance(x), x.mask > 0, cov_fraction, x.mask > 0)
    per_token = -x.adv * x.ratio + jnp.where(selected, kl_cov_coef * jnp.abs(x.log_ratio), 0.0)
    return per_token, x.ratio


# --- Token level: the one table and its dispatcher --------------------------------------------

POLICY_LOSS_FUNCTIONS = {
    "ppo": ppo_loss,
    "grpo": grpo_loss,
    "bnpo": bnpo_loss,
    "dr_grpo": dr_grpo_loss,
    "dapo": dapo_loss,
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gpg": gpg_loss,
    "geo_mean": geo_mean_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}
"""loss_type -> its loss function; `policy_loss` dispatches through this table only."""

POLICY_LOSSES = tuple(POLICY_LOSS_FUNCTIONS)

_OPTIONS = {
    loss_type: {
        name: parameter.default
        for name, parameter in inspect.signature(fn).parameters.items()
        if name not in _ARRAYS
    }
    for loss_type, fn in POLICY_LOSS_FUNCTIONS.items()
}
_ALL_OPTIONS = tuple(dict.fromkeys(name for options in _OPTIONS.values() for name in options))

DEFAULT_AGGREGATION = {loss_type: options["aggregation"] for loss_type, options in _OPTIONS.items()}
"""loss_type -> the aggregation its function defaults to (read from its signature)."""


_OPTION_RANGES = {  # the open-below ranges of the options only some types take
    "dual_clip": (1.0, float("inf")),
    "sapo_tau_pos": (0.0, float("inf")),
    "sapo_tau_neg": (0.0, float("inf")),
    "cov_fraction": (0.0, 1.0),
}


def policy_loss(logp, old_logp, advantages, mask, *, loss_type: str = "grpo", **options):
    """Policy-gradient loss over sampled tokens: `LossOutput(total, count, metrics)`.

    Calls `POLICY_LOSS_FUNCTIONS[loss_type]` with the arguments in `options` that it takes;
    the others are ignored, so that one call site can switch `loss_type` (an unknown name
    raises a TypeError). `aggregation=None` means the loss type's default.

    Inputs are [B, T]: `logp` (current policy), `old_logp` (rollout policy),
    `mask`; `advantages` is [B] (one per sequence) or [B, T]. With
    ρ_t = exp(clip(log π − log π_old, ±20)) and A the (never differentiated) advantage,
    the per-token loss ℓ_t is (see each function's docstring and docs/rl_losses.md):
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
    Options every type takes: `epsilon` (ε_low, 0.2), `epsilon_high` (None: ε, 0.28 for
    dapo), `aggregation`, `max_length`, `segment_ids` (packed sequences), `ref_logp`,
    `kl_coef` (0), `kl_estimator` ("k3"), `entropy`, `entropy_coef` (0). Their own:
    `dual_clip` (ppo, 3.0), `sapo_tau_pos` / `sapo_tau_neg` (sapo, 1.0 / 1.05),
    `cov_fraction` (clip_cov and kl_cov, 2e-4), `clip_cov_bounds` ((1, 5)) and `key` (random
    selection) for clip_cov, `kl_cov_coef` (kl_cov, 1.0).

    Metrics are token sums (see `LossOutput.metric_means`): clip_frac_low
    (A < 0, ρ < 1 − ε), clip_frac_high (A > 0, ρ > 1 + ε_high), approx_kl
    (k3 estimate of KL(π_old‖π)), ratio, ratio_min, ratio_max, and kl /
    entropy when given.
    """
    check.choice("loss_type", loss_type, POLICY_LOSSES)
    unknown = [name for name in options if name not in _ALL_OPTIONS]
    if unknown:
        raise TypeError(
            f"policy_loss() got unexpected keyword argument(s) {', '.join(unknown)}; "
            f"the options of the loss types are: {', '.join(_ALL_OPTIONS)}"
        )
    if "aggregation" in options and options["aggregation"] is None:
        del options["aggregation"]
    # An option the chosen type ignores is still range-checked: a bad value never passes unseen.
    for name, (low, high) in _OPTION_RANGES.items():
        if options.get(name) is not None:
            check.static_range(name, options[name], low, high, low_open=True)
    own = {name: value for name, value in options.items() if name in _OPTIONS[loss_type]}
    return POLICY_LOSS_FUNCTIONS[loss_type](logp, old_logp, advantages, mask, **own)
