"""Credit assignment over turns: returns, per-turn group baselines, GAE over turns, spreading
per-turn values onto tokens, trajectory slicing, potential-based shaping and efficiency rewards."""

import itertools
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from agentic_jax import rl
from agentic_jax.rl import (
    TURN_GROUP_ESTIMATORS,
    efficiency_penalty,
    group_advantages,
    policy_loss,
    potential_shaping,
    slice_turns,
    spread_over_turns,
    token_gae,
    turn_group_advantages,
    turn_returns,
)

N, G, K = 2, 4, 3


def _prefix_mask(lengths, turns):
    return np.arange(turns) < np.asarray(lengths)[..., None]


@st.composite
def _episodes(draw, shape=(N * G,)):
    """Turn rewards [*shape, K] (few distinct values, so ties occur) and a prefix turn mask."""
    rewards = draw(hnp.arrays(np.float32, (*shape, K), elements=st.sampled_from([-1.0, 0.0, 0.5])))
    noise = draw(hnp.arrays(np.float32, (*shape, K), elements=st.floats(-2.0, 2.0, width=32)))
    rewards = np.where(draw(st.booleans()), rewards, rewards + noise)
    lengths = draw(hnp.arrays(np.int32, shape, elements=st.integers(0, K)))
    return rewards.astype(np.float32), _prefix_mask(lengths, K)


def _slow_returns(rewards, mask, gamma):
    returns = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        following = 0.0
        for k in reversed(range(rewards.shape[1])):
            if mask[b, k]:
                following = rewards[b, k] + gamma * following
                returns[b, k] = following
    return returns


def _slow_turn_group_advantages(returns, mask, estimator, eps=1e-6, ddof=1):
    out = np.zeros_like(returns, dtype=np.float64)
    for i, k in itertools.product(range(returns.shape[0]), range(returns.shape[2])):
        members = [j for j in range(returns.shape[1]) if mask[i, j, k]]
        n = len(members)
        if n < 2:
            continue
        values = np.array([returns[i, j, k] for j in members], np.float64)
        for j, value in zip(members, values):
            if estimator == "grpo":
                out[i, j, k] = (value - values.mean()) / (values.std(ddof=ddof) + eps)
            elif estimator == "dr_grpo":
                out[i, j, k] = value - values.mean()
            else:  # rloo: the mean of the others
                others = [v for m, v in zip(members, values) if m != j]
                out[i, j, k] = value - np.mean(others)
    return out


class TurnReturnsTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(episodes=_episodes(), gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]))
    def test_returns_match_a_slow_loop(self, episodes, gamma):
        rewards, mask = episodes
        garbage = np.where(mask, rewards, np.nan).astype(np.float32)  # missing turns never matter
        returns = self.variant(turn_returns, static_argnames="gamma")(garbage, mask, gamma=gamma)
        chex.assert_shape(returns, rewards.shape)
        chex.assert_type(returns, jnp.float32)
        np.testing.assert_allclose(
            returns, _slow_returns(rewards, mask, gamma), rtol=1e-5, atol=1e-5
        )
        assert np.all(np.asarray(returns)[~mask] == 0.0)

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(episodes=_episodes(shape=(N, G)), data=st.data())
    def test_turn_group_advantages_match_a_slow_loop(self, episodes, data):
        returns, mask = episodes
        ddof = data.draw(st.sampled_from([0, 1]))
        advantages_fn = self.variant(
            turn_group_advantages, static_argnames=("estimator", "eps", "std_ddof")
        )
        for estimator in TURN_GROUP_ESTIMATORS:
            advantages = advantages_fn(returns, mask, estimator=estimator, std_ddof=ddof)
            chex.assert_shape(advantages, returns.shape)
            expected = _slow_turn_group_advantages(returns, mask, estimator, ddof=ddof)
            np.testing.assert_allclose(
                advantages, expected, rtol=1e-4, atol=1e-4, err_msg=estimator
            )
            assert np.all(np.asarray(advantages)[~mask] == 0.0), estimator


def test_equal_returns_give_exactly_zero_and_lone_turns_get_no_advantage():
    returns = np.full((N, G, K), 0.7, np.float32)
    mask = _prefix_mask([[3, 3, 2, 1], [1, 3, 0, 0]], K)
    for estimator in TURN_GROUP_ESTIMATORS:
        np.testing.assert_array_equal(turn_group_advantages(returns, mask, estimator=estimator), 0)
    rng = np.random.default_rng(0)
    returns = rng.normal(size=(N, G, K)).astype(np.float32)
    for estimator in TURN_GROUP_ESTIMATORS:
        advantages = np.asarray(turn_group_advantages(returns, mask, estimator=estimator))
        # Group 1 has turn 1 in one episode only (and turn 2 likewise): no baseline, 0.
        assert np.all(advantages[1, :, 1:] == 0.0), estimator
        assert np.all(advantages[1, :2, 0] != 0.0), estimator


def test_full_masks_are_group_advantages_per_turn_index():
    rng = np.random.default_rng(1)
    returns = rng.normal(size=(N, G, K)).astype(np.float32)
    for estimator in TURN_GROUP_ESTIMATORS:
        per_turn = turn_group_advantages(returns, np.ones((N, G, K)), estimator=estimator)
        for k in range(K):
            np.testing.assert_allclose(
                per_turn[:, :, k],
                group_advantages(returns[:, :, k], estimator=estimator),
                rtol=1e-6,
                atol=1e-6,
                err_msg=estimator,
            )


def _slow_turn_gae(rewards, values, mask, gamma, lam):
    """GAE along each episode's turns, as a plain loop (V = 0 after the last turn)."""
    advantages = np.zeros_like(rewards, dtype=np.float64)
    for b in range(rewards.shape[0]):
        turns = np.flatnonzero(mask[b])
        next_value = next_advantage = 0.0
        for k in turns[::-1]:
            delta = rewards[b, k] + gamma * next_value - values[b, k]
            next_advantage = delta + gamma * lam * next_advantage
            next_value = values[b, k]
            advantages[b, k] = next_advantage
    return advantages


class TurnGAETest(chex.TestCase):
    """GAE over turns is `token_gae` with the turn mask (the project's one GAE)."""

    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(
        episodes=_episodes(),
        values=hnp.arrays(np.float32, (N * G, K), elements=st.floats(-3.0, 3.0, width=32)),
        gamma=st.sampled_from([0.9, 1.0]),
        lam=st.sampled_from([0.0, 0.8, 1.0]),
    )
    def test_token_gae_over_turns_matches_a_slow_loop(self, episodes, values, gamma, lam):
        rewards, mask = episodes
        gae_fn = self.variant(token_gae, static_argnames=("gamma", "lam"))
        advantages, returns = gae_fn(rewards, values, mask, gamma=gamma, lam=lam)
        expected = _slow_turn_gae(rewards, values, mask, gamma, lam)
        np.testing.assert_allclose(advantages, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(returns, np.where(mask, expected + values, 0.0), atol=1e-5)
        # λ = 1 with a zero critic: the advantages are the turn returns.
        zero_critic, _ = gae_fn(rewards, np.zeros_like(values), mask, gamma=gamma, lam=1.0)
        np.testing.assert_allclose(zero_critic, turn_returns(rewards, mask, gamma=gamma), atol=1e-6)


@st.composite
def _spans(draw, batch=3, turns=K, length=12):
    """Disjoint, increasing [start, end) spans of the valid (prefix) turns; [0, 0) for the rest."""
    spans = np.zeros((batch, turns, 2), np.int32)
    lengths = np.zeros(batch, np.int32)
    for b in range(batch):
        cuts = sorted(
            draw(st.lists(st.integers(0, length), min_size=2 * turns, max_size=2 * turns))
        )
        lengths[b] = draw(st.integers(0, turns))
        for k in range(lengths[b]):
            spans[b, k] = cuts[2 * k], cuts[2 * k + 1]
    return spans, _prefix_mask(lengths, turns)


class SpanTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    @settings(max_examples=8)
    @given(
        spans=_spans(),
        values=hnp.arrays(np.float32, (3, K), elements=st.floats(-5.0, 5.0, width=32)),
    )
    def test_spread_and_slice_match_loops(self, spans, values):
        spans, mask = spans
        values = np.where(mask, values, np.nan).astype(np.float32)  # missing turns: empty spans
        spread = self.variant(spread_over_turns, static_argnames="length")(values, spans, 12)
        masks = self.variant(slice_turns, static_argnames="length")(spans, mask, 12)
        chex.assert_shape((spread, masks), ((3, 12), (3 * K, 12)))
        chex.assert_type((spread, masks), jnp.float32)
        expected_spread = np.zeros((3, 12), np.float32)
        expected_masks = np.zeros((3 * K, 12), np.float32)
        for b, k in itertools.product(range(3), range(K)):
            start, end = spans[b, k]
            for t in range(start, end):
                expected_spread[b, t] = values[b, k]
                expected_masks[b * K + k, t] = float(mask[b, k])
        np.testing.assert_array_equal(spread, expected_spread)
        np.testing.assert_array_equal(masks, expected_masks)


def _transcripts():
    """Two episodes of length T = 10: policy turns interleaved with tool/prompt tokens."""
    spans = np.array([[[1, 3], [5, 8], [9, 10]], [[2, 4], [6, 7], [0, 0]]], np.int32)
    mask = np.array([[1, 1, 1], [1, 1, 0]], bool)
    rng = np.random.default_rng(3)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, (2, 10)), jnp.float32)
    old_logp = logp + jnp.asarray(rng.normal(0.0, 0.3, (2, 10)), jnp.float32)
    return spans, mask, logp, old_logp


@pytest.mark.parametrize("loss_type", ["ppo", "grpo", "cispo"])
def test_trajectory_slicing_reproduces_the_whole_episode_loss(loss_type):
    spans, mask, logp, old_logp = _transcripts()
    episode_adv = jnp.array([1.5, -0.7])
    rows = slice_turns(spans, mask, 10)
    episode_mask = rows.reshape(2, K, 10).sum(axis=1)  # the union of the policy turns

    def losses(logp, aggregation):
        whole = policy_loss(
            logp, old_logp, episode_adv, episode_mask, loss_type=loss_type, aggregation=aggregation
        )
        sliced = policy_loss(
            jnp.repeat(logp, K, axis=0),
            jnp.repeat(old_logp, K, axis=0),
            jnp.repeat(episode_adv, K),  # every turn has its episode's advantage
            rows,
            loss_type=loss_type,
            aggregation=aggregation,
        )
        return whole, sliced

    for aggregation in ("token-mean", "seq-mean-token-sum"):
        whole, sliced = jax.jit(losses, static_argnums=1)(logp, aggregation)
        np.testing.assert_allclose(sliced.total, whole.total, rtol=1e-6, err_msg=aggregation)
        if aggregation == "token-mean":
            assert sliced.count == whole.count == episode_mask.sum()
            np.testing.assert_allclose(sliced.value, whole.value, rtol=1e-6)
            whole_grad = jax.grad(lambda lp: losses(lp, "token-mean")[0].value)(logp)
            sliced_grad = jax.grad(lambda lp: losses(lp, "token-mean")[1].value)(logp)
            np.testing.assert_allclose(sliced_grad, whole_grad, rtol=1e-6, atol=1e-8)
        else:  # token sums: the same total, counted per turn instead of per episode
            assert whole.count == 2 and sliced.count == mask.sum()
            np.testing.assert_allclose(sliced.total / 2, whole.value, rtol=1e-6)


def test_per_turn_advantages_spread_equal_the_sliced_rows():
    """Per-turn advantages: spreading them onto the transcript equals slicing it into turns."""
    spans, mask, logp, old_logp = _transcripts()
    turn_adv = jnp.array([[1.0, -2.0, 0.5], [0.3, 0.7, 9.0]])
    spread = spread_over_turns(turn_adv, spans, 10)
    episode_mask = slice_turns(spans, mask, 10).reshape(2, K, 10).sum(axis=1)
    whole = policy_loss(logp, old_logp, spread, episode_mask, loss_type="ppo")
    sliced = policy_loss(
        jnp.repeat(logp, K, axis=0),
        jnp.repeat(old_logp, K, axis=0),
        turn_adv.reshape(-1),
        slice_turns(spans, mask, 10),
        loss_type="ppo",
    )
    np.testing.assert_allclose(sliced.value, whole.value, rtol=1e-6)


def _enumerate_mdp(rng, actions=3, turns=K, stop=2):
    """Every episode of a tiny deterministic tree MDP: the state is the history of actions, the
    episode ends after `turns` turns or when action `stop` is taken. Returns per-episode turn
    rewards, masks, Φ(s_k) and Φ(s_{k+1}) (Φ = 0 after the last turn), and Φ(s_0)."""
    reward_of, potential_of = {}, {}

    def potential(state):
        return potential_of.setdefault(state, rng.normal())

    episodes = sorted(
        {
            tuple(seq[: seq.index(stop) + 1] if stop in seq else seq)
            for seq in itertools.product(range(actions), repeat=turns)
        }
    )
    shape = (len(episodes), turns)
    rewards, mask, phi_tm1, phi_t = (np.zeros(shape, np.float32) for _ in range(4))
    for i, episode in enumerate(episodes):
        for k, action in enumerate(episode):
            state = episode[:k]
            rewards[i, k] = reward_of.setdefault((state, action), rng.normal())
            mask[i, k] = 1.0
            phi_tm1[i, k] = potential(state)
            phi_t[i, k] = potential(episode[: k + 1]) if k + 1 < len(episode) else 0.0
    return rewards, mask, phi_tm1, phi_t, potential(())


@settings(max_examples=5)
@given(seed=st.integers(0, 2**16), gamma=st.sampled_from([0.8, 1.0]))
def test_potential_shaping_of_turn_rewards_keeps_the_ranking_of_every_episode(seed, gamma):
    rewards, mask, phi_tm1, phi_t, phi_0 = _enumerate_mdp(np.random.default_rng(seed))
    last = mask.sum(axis=1, keepdims=True) - 1
    discount = np.where(np.arange(K) < last, gamma, 0.0).astype(np.float32)  # 0 after the last
    shaped = jax.vmap(potential_shaping)(rewards, discount, phi_tm1, phi_t)
    returns = np.asarray(turn_returns(rewards, mask, gamma=gamma)[:, 0], np.float64)
    shaped_returns = np.asarray(turn_returns(shaped, mask, gamma=gamma)[:, 0], np.float64)
    np.testing.assert_allclose(shaped_returns - returns, -phi_0, rtol=1e-5, atol=1e-5)
    assert np.argmax(shaped_returns) == np.argmax(returns)
    i, j = np.triu_indices(len(returns), 1)
    distinct = np.abs(returns[i] - returns[j]) > 1e-3
    assert distinct.sum() > 0.9 * distinct.size
    np.testing.assert_array_equal(
        np.sign(shaped_returns[i] - shaped_returns[j])[distinct],
        np.sign(returns[i] - returns[j])[distinct],
    )


class EfficiencyTest(chex.TestCase):
    @chex.variants(with_jit=True, without_jit=True)
    def test_only_successes_pay_for_calls_and_tokens(self):
        penalty_fn = self.variant(efficiency_penalty, static_argnames=("per_call", "per_token"))
        success = np.array([True, False, True, True])
        calls, tokens = np.array([3, 5, 0, 1]), np.array([100.0, 7.0, 50.0, 10.0])
        penalty = penalty_fn(success, calls, tokens, per_call=0.1, per_token=0.001)
        chex.assert_type(penalty, jnp.float32)
        np.testing.assert_allclose(penalty, [-0.4, 0.0, -0.05, -0.11], rtol=1e-6)
        np.testing.assert_array_equal(penalty_fn(success, calls, tokens), 0.0)
        # Fewer calls for the same success is better; a failure is never rewarded for brevity.
        assert penalty[2] > penalty[0] and penalty[1] == 0.0


def test_errors_name_the_argument():
    rewards, mask = np.zeros((2, K), np.float32), np.ones((2, K))
    with pytest.raises(ValueError, match="turn_rewards must be 2-D"):
        turn_returns(rewards[0], mask[0])
    with pytest.raises(ValueError, match=r"turn_mask must have shape \(2, 3\)"):
        turn_returns(rewards, mask[:, :2])
    with pytest.raises(ValueError, match="turn_rewards must be a floating-point array"):
        turn_returns(rewards.astype(np.int32), mask)
    with pytest.raises(ValueError, match="gamma must lie in"):
        turn_returns(rewards, mask, gamma=1.5)
    with pytest.raises(ValueError, match="unknown estimator 'ppo'; valid values: grpo, dr_grpo"):
        turn_group_advantages(np.zeros((N, G, K)), np.ones((N, G, K)), estimator="ppo")
    with pytest.raises(ValueError, match="turn_returns must be 3-D"):
        turn_group_advantages(rewards, mask)
    with pytest.raises(ValueError, match=r"turn_mask must have shape \(2, 4, 3\)"):
        turn_group_advantages(np.zeros((N, G, K)), mask)
    spans = np.zeros((2, K, 2), np.int32)
    with pytest.raises(ValueError, match=r"turn_spans must have shape \(2, 3, 2\)"):
        spread_over_turns(rewards, spans[:, :, :1], 8)
    with pytest.raises(ValueError, match="turn_spans must be an integer array"):
        slice_turns(spans.astype(np.float32), mask, 8)
    with pytest.raises(ValueError, match="turn_values must be 2-D"):
        spread_over_turns(rewards[0], spans, 8)
    for length in (0, 2.5):
        with pytest.raises(ValueError, match="length must be a"):
            slice_turns(spans, mask, length)
    with pytest.raises(ValueError, match=r"tool_calls must have shape \(4,\)"):
        efficiency_penalty(np.ones(4), np.ones(3), np.ones(4))
    with pytest.raises(ValueError, match="per_call must lie in"):
        efficiency_penalty(np.ones(4), np.ones(4), np.ones(4), per_call=-1.0)
    with pytest.raises(ValueError, match="success must be 1-D"):
        efficiency_penalty(np.ones((4, 1)), np.ones(4), np.ones(4))


def test_exported_and_documented():
    docs = (Path(__file__).parents[1] / "docs" / "rl_losses.md").read_text()
    for name in (
        "turn_returns",
        "turn_group_advantages",
        "spread_over_turns",
        "slice_turns",
        "efficiency_penalty",
    ):
        assert name in rl.__all__ and callable(getattr(rl, name)), name
        assert f"`{name}(" in docs, name
    assert "`token_gae(turn_rewards, turn_values, turn_mask" in docs  # GAE over turns
