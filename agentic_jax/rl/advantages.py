"""Advantage estimators: GAE over one stream or over LLM tokens, and critic-free group baselines.

GAE (`gae`, `token_gae`) weighs a critic's TD errors; both run one masked backward recursion.
Critic-free methods sample G responses per prompt and use the other responses'
rewards as the baseline; they differ in the baseline and in the scale.
Advantages are targets: the losses never differentiate through them.
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.numerics import safe_div

GROUP_ESTIMATORS = (
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_pp",
    "reinforce_pp_baseline",
    "remax",
    "opo",
)
GROUP_SCALES = ("group", "batch", "none")


def _centered(x: jax.Array, axis) -> jax.Array:
    """x − mean(x), shifted by one element first so that equal values give exactly 0.

    A float32 mean of equal values is not always that value; the rounding
    residue divided by a std of the same size would give O(1) advantages.
    """
    shift = x[:, :1] if axis == 1 else x.ravel()[0]
    shifted = x - shift
    return shifted - jnp.mean(shifted, axis=axis, keepdims=True)


def _std(x: jax.Array, axis, ddof: int) -> jax.Array:
    """Standard deviation with `ddof` (1 = Bessel); 0 rather than NaN for one sample."""
    n = x.size if axis is None else x.shape[axis]
    return jnp.sqrt(
        jnp.sum(jnp.square(_centered(x, axis)), axis=axis, keepdims=True) / max(n - ddof, 1)
    )


def _whiten(x: jax.Array, axis, ddof: int, eps: float) -> jax.Array:
    return _centered(x, axis) / (_std(x, axis, ddof) + eps)


def group_advantages(
    rewards, *, estimator="grpo", scale="group", eps=1e-6, std_ddof=1, lengths=None, baseline=None
):
    """Advantages [num_groups, G] from scalar rewards [num_groups, G] of G responses per prompt.

    With r̄ the group mean:
      grpo:      (r − r̄) / (σ + eps); σ over the group (scale="group"), over the
                 whole batch (scale="batch") or 1 (scale="none"). σ uses `std_ddof`,
                 Bessel-corrected by default as in TRL and verl.
                 Shao et al. (2024), DeepSeekMath, arXiv:2402.03300.
      dr_grpo:   r − r̄, no scaling. Liu et al. (2025), arXiv:2503.20783.
      rloo:      r − mean of the other G − 1 rewards = G/(G − 1)·(r − r̄).
                 Ahmadian et al. (2024), arXiv:2402.14740.
      reinforce_pp:          rewards whitened over the batch, no group baseline.
      reinforce_pp_baseline: r − r̄, then whitened over the batch.
                 Hu (2025), REINFORCE++, arXiv:2501.03262.
      remax:     r − `baseline` [num_groups], the greedy response's reward.
                 Li et al. (2023), arXiv:2310.10505.
      opo:       r − Σ_i l_i·r_i / Σ_i l_i with `lengths` [num_groups, G]: the
                 length-weighted optimal baseline. Hao et al. (2025), arXiv:2505.23585.
    `scale` applies to "grpo" only. All-equal rewards give zero advantages.
    """
    check.choice("estimator", estimator, GROUP_ESTIMATORS)
    check.choice("scale", scale, GROUP_SCALES)
    if estimator != "grpo" and scale != "group":
        raise ValueError(
            f"scale applies to estimator='grpo' only, got scale={scale!r} with {estimator!r}"
        )
    rewards = check.rank("rewards", check.floating("rewards", rewards), 2)
    group_size = rewards.shape[1]
    centered = _centered(rewards, 1)
    if estimator == "grpo":
        if scale == "none":
            return centered
        std = _std(rewards, 1 if scale == "group" else None, std_ddof)
        return centered / (std + eps)
    if estimator == "dr_grpo":
        return centered
    if estimator == "rloo":
        if group_size < 2:
            raise ValueError(
                f"rloo needs a group size of at least 2, got rewards of shape {rewards.shape}"
            )
        return centered * group_size / (group_size - 1)
    if estimator == "reinforce_pp":
        return _whiten(rewards, None, std_ddof, eps)
    if estimator == "reinforce_pp_baseline":
        return _whiten(centered, None, std_ddof, eps)
    if estimator == "remax":
        baseline = check.required(
            "baseline", baseline, "for estimator='remax' (the greedy reward per group)"
        )
        baseline = check.shape("baseline", check.floating("baseline", baseline), rewards.shape[:1])
        return rewards - baseline[:, None]
    lengths = check.required("lengths", lengths, "for estimator='opo' (response lengths)")
    lengths = check.shape("lengths", check.numeric("lengths", lengths), rewards.shape)
    weighted = safe_div(
        jnp.sum(lengths * rewards, axis=1, keepdims=True), jnp.sum(lengths, axis=1, keepdims=True)
    )
    return rewards - weighted


def masked_whiten(values, mask, *, shift_mean=True, ddof=1, eps=1e-8) -> jax.Array:
    """(x − mean) / sqrt(var + eps) over valid entries; 0 on masked entries.

    `shift_mean=False` adds the mean back (whitens the scale only), as done for
    PPO advantages in verl and TRL. Masked entries never affect the statistics.
    """
    values = check.floating("values", values)
    mask = check.shape("mask", check.mask("mask", mask), values.shape)
    count = jnp.sum(mask)
    # Masked entries may be inf or NaN (0·inf is NaN): zero them before any product with the mask.
    values = jnp.where(mask > 0, values, 0.0)
    # Shift by a valid entry first, so that equal values whiten to exactly 0.
    shift = values.ravel()[jnp.argmax(mask.ravel())]
    mean = safe_div(jnp.sum((values - shift) * mask), count)
    centered = values - shift - mean
    var = safe_div(jnp.sum(jnp.square(centered) * mask), jnp.maximum(count - ddof, 1.0))
    whitened = centered * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean + shift
    return jnp.where(mask > 0, whitened, 0.0)


# GAE: one masked single-stream recursion, shared by `gae` (every step valid, a bootstrap value)
# and `token_gae` (vmapped over rows, masked tokens bridged, zero bootstrap).  The scan body
# lives at module level so that eager calls reuse its compilation.
def _masked_gae_step(carry, xs):
    """A_t = δ_t + γ_t·λ_t·A_{t+1}, δ_t = r_t + γ_t·V_next − V_t; a masked step passes the carry on."""
    next_value, next_advantage = carry
    r, v, valid, discount, decay = xs
    advantage = r + discount * next_value - v + decay * next_advantage
    carry = (jnp.where(valid, v, next_value), jnp.where(valid, advantage, next_advantage))
    return carry, jnp.where(valid, advantage, 0.0)


def _masked_gae(r_t, v_t, valid_t, discount_t, decay_t, bootstrap_value) -> jax.Array:
    """GAE along the valid steps of one stream [T]; `decay_t = γ_t·λ_t`; 0 on masked steps.

    V_next is the value of the next *valid* step (`bootstrap_value` after the last one), so
    masked steps are skipped as if absent: their rewards and values never matter.
    """
    init = (bootstrap_value, jnp.zeros_like(bootstrap_value))
    _, advantages = jax.lax.scan(
        _masked_gae_step, init, (r_t, v_t, valid_t, discount_t, decay_t), reverse=True
    )
    return advantages


def gae(r_t, values, discount_t, lambda_) -> jax.Array:
    """Generalized advantage estimates A_t = Σ_k (Π γλ) δ_{t+k} for one stream [T].

    δ_t = r_t + γ_t·V_{t+1} − V_t, A_t = δ_t + γ_t·λ_t·A_{t+1}; `values` has T+1
    entries (the last one bootstraps), `lambda_` is a scalar or per step [T].
    λ = 1 gives discounted Monte-Carlo returns minus values, λ = 0 the one-step TD error.
    `jax.vmap` it for batches. Schulman et al. (2015), "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation", arXiv:1506.02438.
    """
    r_t, discount_t = check.stream(r_t=r_t, discount_t=discount_t)
    length = r_t.shape[0]
    values = check.shape("values", check.floating("values", values), (length + 1,))
    lambda_ = check.per_step("lambda_", lambda_, length)
    valid = jnp.ones((length,), bool)
    return _masked_gae(r_t, values[:-1], valid, discount_t, discount_t * lambda_, values[-1])


def token_gae(rewards, values, mask, *, gamma=1.0, lam=0.95):
    """GAE over the valid tokens of LLM responses: (advantages, returns), each [B, T].

    Masked tokens (prompt, padding, tool/observation tokens in multi-turn
    rollouts) are skipped: the recursion bridges over them, so their values and
    rewards never matter, and their outputs are 0. Along valid tokens this is
    `gae` with discount γ and a zero value after the last one (the same recursion).
    Schulman et al. (2015), arXiv:1506.02438; masking as in verl's GAE.
    """
    rewards = check.rank("rewards", check.floating("rewards", rewards), 2)
    values = check.shape("values", check.floating("values", values), rewards.shape)
    mask = check.shape("mask", check.mask("mask", mask), rewards.shape)
    length = rewards.shape[1]
    discount = jnp.broadcast_to(jnp.asarray(gamma, jnp.float32), (length,))
    decay = jnp.broadcast_to(jnp.asarray(gamma * lam, jnp.float32), (length,))
    rows = jax.vmap(_masked_gae, in_axes=(0, 0, 0, None, None, None))
    advantages = rows(rewards, values, mask > 0, discount, decay, jnp.float32(0.0))
    return advantages, jnp.where(mask > 0, advantages + values, 0.0)


def counterfactual_advantages(q_values, policy, actions) -> jax.Array:
    """COMA's counterfactual advantage of each agent's action, ``[..., N]``.

    A_i(s, u) = Q(s, (u_{-i}, u_i)) − Σ_{u'_i} π_i(u'_i | τ_i)·Q(s, (u_{-i}, u'_i)): a centralised
    critic scores agent i's action against the actions it could have taken with everyone else's
    held fixed, which credits each agent with its own part of a shared reward.  The baseline does
    not depend on u_i, so E_{u_i ~ π_i}[A_i] = 0 and the policy gradient stays unbiased.
    ``q_values`` ``[..., N, A]``: row i is Q with agent i's action varied over its A choices;
    ``policy`` ``[..., N, A]``: each agent's action probabilities; ``actions`` ``[..., N]``.
    Foerster et al. (2018), "Counterfactual Multi-Agent Policy Gradients", arXiv:1705.08926.
    """
    q_values = check.floating("q_values", q_values)
    policy = check.shape("policy", check.floating("policy", policy), q_values.shape)
    actions = check.shape("actions", check.integer("actions", actions), q_values.shape[:-1])
    taken = jnp.take_along_axis(q_values, actions[..., None], axis=-1)[..., 0]
    return jax.lax.stop_gradient(taken - jnp.sum(policy * q_values, axis=-1))
