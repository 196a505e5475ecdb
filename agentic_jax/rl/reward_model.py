"""Reward-model training losses: pairwise, listwise and per-step (process) supervision."""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.aggregation import aggregate
from agentic_jax.rl.types import LossOutput


def bradley_terry_loss(
    chosen_rewards, rejected_rewards, *, margin=None, center_coef=0.0
) -> jax.Array:
    """−log σ(r_w − r_l − m) + c·(r_w + r_l)², per pair [B].

    `margin` m [B] (e.g. from preference strength, Llama 2) asks for a larger
    gap on clearer pairs; `center_coef` c pins rewards near zero mean, since the
    Bradley–Terry likelihood is invariant to a shift.
    Bradley & Terry (1952); Touvron et al. (2023), arXiv:2307.09288 (margin);
    Eisenstein et al. (2023), arXiv:2312.09244 (centering).
    """
    chosen = check.rank("chosen_rewards", check.floating("chosen_rewards", chosen_rewards), 1)
    rejected = check.shape(
        "rejected_rewards", check.floating("rejected_rewards", rejected_rewards), chosen.shape
    )
    gap = chosen - rejected
    if margin is not None:
        gap = gap - check.shape("margin", check.floating("margin", margin), chosen.shape)
    return -jax.nn.log_sigmoid(gap) + center_coef * jnp.square(chosen + rejected)


def plackett_luce_loss(scores, mask=None) -> jax.Array:
    """ListMLE: −log P_PL(ranking) = −Σ_k [s_k − log Σ_{j ≥ k} e^{s_j}], per list [B].

    `scores` [B, K] are listed best first; `mask` [B, K] drops missing items
    (anywhere in the list). With K = 2 this is the Bradley–Terry loss.
    Plackett (1975), Luce (1959); Xia et al. (2008), "Listwise approach to learning to rank".
    """
    scores = check.rank("scores", check.floating("scores", scores), 2)
    mask = (
        jnp.ones_like(scores)
        if mask is None
        else check.shape("mask", check.mask("mask", mask), scores.shape)
    )
    valid = mask > 0
    # Missing items get a score whose exponential is exactly 0 next to any real score.
    suffix = jax.lax.cumlogsumexp(jnp.where(valid, scores, -1e30), axis=1, reverse=True)
    return -jnp.sum(jnp.where(valid, scores - suffix, 0.0), axis=1)


def process_reward_loss(step_logits, step_labels, mask, *, aggregation="token-mean") -> LossOutput:
    """Per-step binary cross-entropy for process reward models, as a `LossOutput`.

    BCE(x, y) = softplus(x) − y·x for step logits x [B, S] and labels y ∈ [0, 1]
    (hard correctness or soft Monte-Carlo estimates), on valid steps.
    Lightman et al. (2023), "Let's Verify Step by Step", arXiv:2305.20050;
    Wang et al. (2024), "Math-Shepherd", arXiv:2312.08935 (soft labels).
    """
    logits = check.rank("step_logits", check.floating("step_logits", step_logits), 2)
    labels = check.shape("step_labels", check.floating("step_labels", step_labels), logits.shape)
    mask = check.shape("mask", check.mask("mask", mask), logits.shape)
    logits = jnp.where(mask > 0, logits, 0.0)
    per_step = jax.nn.softplus(logits) - labels * logits
    total, count = aggregate(per_step, mask, aggregation)
    accurate = (logits > 0) == (labels > 0.5)
    metrics = {"tokens": jnp.sum(mask), "accuracy": jnp.sum(mask * accurate)}
    return LossOutput(total, count, metrics)
