"""Credit assignment over the turns of multi-turn (tool-use) episodes.

An episode has up to K assistant turns: `turn_rewards[B, K]`, `turn_mask[B, K]` (1 on the
turns the episode has; the valid turns are a prefix) and `turn_spans[B, K, 2]`, the int32
[start, end) token positions of each turn's policy tokens in the transcript of length T.

- returns and group baselines per turn: `turn_returns`, `turn_group_advantages`;
- GAE over turns is the project's one GAE: ``token_gae(turn_rewards, turn_values, turn_mask,
  gamma=γ, lam=λ)`` (its mask bridges missing turns exactly as it bridges masked tokens);
- from turns to tokens: `spread_over_turns` (a per-turn quantity onto its tokens) and
  `slice_turns` (one training row per turn, "trajectory slicing");
- `efficiency_penalty`: fewer tool calls and tokens for the same success.

Potential-based shaping of turn rewards is `value_learning.potential_shaping` vmapped over
episodes, with `discount_t = 0` on the last turn (docs/rl_losses.md).
"""

import operator

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check
from agentic_jax.rl.advantages import token_gae
from agentic_jax.rl.numerics import safe_div

TURN_GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")


def _turns(rewards_name, rewards, mask_name, mask):
    """float32 [B, K] values and their [B, K] mask, masked entries zeroed (NaN cannot leak)."""
    rewards = check.rank(rewards_name, check.floating(rewards_name, rewards), 2)
    mask = check.shape(mask_name, check.mask(mask_name, mask), rewards.shape)
    return jnp.where(mask > 0, rewards, 0.0), mask


def turn_returns(turn_rewards, turn_mask, *, gamma=1.0) -> jax.Array:
    """Discounted returns over the valid turns, [B, K]: G_k = r_k + γ·G_{k+1}, 0 on missing turns.

    G_k after the last valid turn is 0 (the episode has ended). This is the project's one masked
    backward recursion (`token_gae` with V = 0 and λ = 1: A_k = r_k + γ·A_{k+1}), so a missing
    turn is bridged as a masked token is; with prefix masks nothing is bridged.
    Sutton & Barto (2018), "Reinforcement Learning", ch. 3; per-turn returns for multi-turn LLM
    agents as in Zeng et al. (2025), "Reinforcing Multi-Turn Reasoning in LLM Agents via
    Turn-Level Credit Assignment", arXiv:2505.11821.
    """
    check.static_range("gamma", gamma, 0.0, 1.0)
    rewards, mask = _turns("turn_rewards", turn_rewards, "turn_mask", turn_mask)
    returns, _ = token_gae(rewards, jnp.zeros_like(rewards), mask, gamma=gamma, lam=1.0)
    return returns


def turn_group_advantages(
    turn_returns, turn_mask, *, estimator="grpo", eps=1e-6, std_ddof=1
) -> jax.Array:
    """Group baselines per turn index, [num_groups, G, K] from returns [num_groups, G, K].

    For each group (the G episodes of one prompt) and each turn index k, the returns G_k of the
    n_k episodes that have turn k are normalised among themselves, with mean Ḡ_k and
    standard deviation σ_k (`std_ddof`, 1 = Bessel) over those episodes only:
      grpo:    (G_k − Ḡ_k) / (σ_k + eps)        Shao et al. (2024), arXiv:2402.03300
      dr_grpo: G_k − Ḡ_k                        Liu et al. (2025), arXiv:2503.20783
      rloo:    G_k − mean of the other n_k − 1 = n_k/(n_k − 1)·(G_k − Ḡ_k)
                                                Ahmadian et al. (2024), arXiv:2402.14740
    The advantage is 0 where the turn is missing and wherever n_k < 2 (no baseline exists).
    As in `group_advantages`, the returns are shifted by one valid entry before centring, so
    equal returns give exactly 0. Turn-level group baselines: Zeng et al. (2025), MT-GRPO,
    arXiv:2505.11821; step-level groups of GiGPO, Feng et al. (2025), arXiv:2505.10978.
    """
    check.choice("estimator", estimator, TURN_GROUP_ESTIMATORS)
    check.static_range("eps", eps, 0.0, float("inf"))
    check.static_range("std_ddof", std_ddof, 0, float("inf"))
    returns = check.rank("turn_returns", check.floating("turn_returns", turn_returns), 3)
    mask = check.shape("turn_mask", check.mask("turn_mask", turn_mask), returns.shape)
    valid = mask > 0
    returns = jnp.where(valid, returns, 0.0)
    count = jnp.sum(mask, axis=1, keepdims=True)  # n_k per group and turn, [num_groups, 1, K]
    # Shift by the first valid return of each (group, turn): equal returns centre to exactly 0.
    first = jnp.argmax(valid, axis=1)[:, None, :]
    shifted = jnp.where(valid, returns - jnp.take_along_axis(returns, first, axis=1), 0.0)
    centered = jnp.where(valid, shifted - safe_div(jnp.sum(shifted, 1, keepdims=True), count), 0.0)
    if estimator == "grpo":
        variance = jnp.sum(jnp.square(centered), 1, keepdims=True) / jnp.maximum(
            count - std_ddof, 1.0
        )
        advantages = centered / (jnp.sqrt(variance) + eps)
    elif estimator == "dr_grpo":
        advantages = centered
    else:
        advantages = centered * safe_div(count, count - 1.0)
    return jnp.where(valid & (count >= 2), advantages, 0.0)


def _length(length) -> int:
    try:
        length = operator.index(length)
    except TypeError:
        raise ValueError(
            f"length must be a static positive int (the transcript length T), got {length!r}"
        ) from None
    if length <= 0:
        raise ValueError(f"length must be a positive int (the transcript length T), got {length}")
    return length


def _spans(turn_spans, batch_shape, length) -> jax.Array:
    """[B, K, T] bool: token t lies in turn k's span [start, end) (empty when end <= start)."""
    turn_spans = check.integer("turn_spans", turn_spans)
    turn_spans = check.shape("turn_spans", turn_spans, (*batch_shape, 2))
    positions = jnp.arange(_length(length))
    start, end = turn_spans[..., 0, None], turn_spans[..., 1, None]
    return (positions >= start) & (positions < end)


def spread_over_turns(turn_values, turn_spans, length: int) -> jax.Array:
    """Per-turn values onto the transcript's tokens, [B, length]: out[b, t] = turn_values[b, k]
    for t in turn k's span [start, end), 0 on tokens outside every span.

    `turn_spans[B, K, 2]` are int32 [start, end) positions; spans must not overlap (overlapping
    spans would add their values); a missing turn needs an empty span (start == end, e.g. [0, 0)),
    and then its value, even NaN, never matters. `length` (T) is static. Use it to turn per-turn
    advantages (`turn_group_advantages`, or GAE over turns) into the per-token advantages of
    `policy_loss`; the loss mask restricts them to policy tokens.
    """
    turn_values = check.rank("turn_values", check.floating("turn_values", turn_values), 2)
    in_span = _spans(turn_spans, turn_values.shape, length)
    return jnp.sum(jnp.where(in_span, turn_values[..., None], 0.0), axis=1)


def slice_turns(turn_spans, turn_mask, length: int) -> jax.Array:
    """Trajectory slicing: one training row per turn, masks [B·K, length] (float32 0/1).

    Row b·K + k is 1 exactly on turn k's span [start, end) of episode b, and all 0 when
    `turn_mask[b, k]` is 0. A causal LM's log-probs of turn k's tokens do not depend on later
    tokens, so the whole transcript with its mask restricted to turn k *is* turn k's row: repeat
    the transcript's per-token arrays K times (``jnp.repeat(x, K, axis=0)``) and give each row its
    own advantage (``jnp.repeat``-ed per-turn advantages reshaped to [B·K]). With every turn given
    the episode's advantage, token-sum losses (token-mean, and the totals of the seq-mean-token-sum
    modes) equal the whole-episode loss; the seq-mean modes then count turns instead of episodes.
    `length` (T) is static.
    """
    turn_mask = check.rank("turn_mask", check.mask("turn_mask", turn_mask), 2)
    in_span = _spans(turn_spans, turn_mask.shape, length) & (turn_mask[..., None] > 0)
    batch, turns = turn_mask.shape
    return in_span.reshape(batch * turns, in_span.shape[-1]).astype(jnp.float32)


def efficiency_penalty(success, tool_calls, tokens, *, per_call=0.0, per_token=0.0) -> jax.Array:
    """R_eff = −(per_call·tool_calls + per_token·tokens) on successful episodes, 0 on failures, [B].

    Added to the task reward, it prefers fewer tool calls and fewer generated tokens for the
    same success, and never makes a failure look better than it is (a failed episode is not
    rewarded for being short). `success` is a boolean or 0/1 mask, `tool_calls` and `tokens`
    counts; `per_call`, `per_token` ≥ 0. Tool-use efficiency rewards: Wang et al. (2025), "OTC:
    Optimal Tool Calls via Reinforcement Learning", arXiv:2504.14870.
    """
    check.static_range("per_call", per_call, 0.0, float("inf"))
    check.static_range("per_token", per_token, 0.0, float("inf"))
    success = check.rank("success", check.mask("success", success), 1)
    tool_calls = check.shape("tool_calls", check.numeric("tool_calls", tool_calls), success.shape)
    tokens = check.shape("tokens", check.numeric("tokens", tokens), success.shape)
    return jnp.where(success > 0, -(per_call * tool_calls + per_token * tokens), 0.0)
