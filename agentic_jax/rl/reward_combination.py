"""Combining rewards: several reward components into one, and process-reward steps into one score."""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.advantages import group_advantages
from agentic_jax.rl.numerics import safe_div

REWARD_COMBINATIONS = ("sum", "gdpo")
STEP_AGGREGATIONS = ("min", "product", "last", "mean")


def combine_rewards(rewards, weights, *, method="sum", eps=1e-6, std_ddof=1) -> jax.Array:
    """One reward per response, [num_groups, G], from R components `rewards[num_groups, G, R]`.

      sum:  Σ_r w_r·r_r, the weighted sum (then normalised as one reward, e.g. by GRPO);
      gdpo: Σ_r w_r·(r_r − r̄_r)/(σ_r + eps), each component z-scored within its group first
            (r̄_r, σ_r over the G responses of the group, σ with `std_ddof`, 1 = Bessel; it is
            `group_advantages(·, estimator="grpo")` per component), so that one component's
            scale cannot drown the others and distinct reward combinations keep distinct values.
    `weights[R]` are the w_r. The gdpo output is already a group-relative advantage (zero mean
    per group, all-equal components contribute exactly 0): do not normalise it per group again.
    The paper then normalises the sum over the whole batch, for a scale independent of R:
    ``masked_whiten(combined, jnp.ones_like(combined))``.
    GDPO: Liu et al. (2026), "GDPO: Group reward-Decoupled Normalization Policy Optimization
    for Multi-reward RL Optimization", arXiv:2601.05242.
    """
    check.choice("method", method, REWARD_COMBINATIONS)
    rewards = check.rank("rewards", check.floating("rewards", rewards), 3)
    weights = check.shape("weights", check.numeric("weights", weights), rewards.shape[2:])
    if method == "sum":
        return jnp.sum(rewards * weights, axis=-1)
    num_groups, group_size, components = rewards.shape
    per_component = jnp.moveaxis(rewards, 2, 0).reshape(components * num_groups, group_size)
    normalised = group_advantages(per_component, estimator="grpo", eps=eps, std_ddof=std_ddof)
    normalised = normalised.reshape(components, num_groups, group_size)
    return jnp.sum(weights[:, None, None] * normalised, axis=0)


def aggregate_steps(step_scores, step_mask, mode="min") -> jax.Array:
    """One score per episode, [B], from process-reward-model step scores `step_scores[B, S]`.

    Scores are per-step probabilities of correctness in [0, 1] (not checked); over the valid
    steps (`step_mask[B, S]`, any pattern):
      min:     the weakest step (a solution is as good as its worst step);
      product: Π_s p_s, the probability that every step is correct (independent steps);
      last:    the score of the last valid step;
      mean:    the mean step score.
    An episode without any valid step scores 0.
    Lightman et al. (2023), "Let's Verify Step by Step", arXiv:2305.20050 (product, and min);
    Wang et al. (2024), "Math-Shepherd", arXiv:2312.08935 (min); last: the final step's score
    taken as the solution's score, the third common choice in PRM evaluations.
    """
    check.choice("mode", mode, STEP_AGGREGATIONS)
    scores = check.rank("step_scores", check.floating("step_scores", step_scores), 2)
    mask = check.shape("step_mask", check.mask("step_mask", step_mask), scores.shape)
    valid = mask > 0
    any_valid = jnp.any(valid, axis=1)
    if mode == "mean":
        return safe_div(jnp.sum(jnp.where(valid, scores, 0.0), axis=1), jnp.sum(mask, axis=1))
    if mode == "min":
        value = jnp.min(jnp.where(valid, scores, jnp.inf), axis=1)
    elif mode == "product":
        value = jnp.prod(jnp.where(valid, scores, 1.0), axis=1)
    else:
        last = scores.shape[1] - 1 - jnp.argmax(valid[:, ::-1], axis=1)
        value = jnp.take_along_axis(scores, last[:, None], axis=1)[:, 0]
    return jnp.where(any_valid, value, 0.0)
