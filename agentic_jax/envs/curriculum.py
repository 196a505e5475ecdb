"""Curricula: which tasks to train on next.  Pure jnp state machines (jit-able), host-callable.

* `PassRateFilter` -- keep the prompts the policy solves sometimes but not
  always (success rate in ``[low, high]``, default [0.3, 0.7]).  Prompts
  solved always or never give a group of samples identical rewards, hence
  zero group-relative advantage and no gradient (the motivation of DAPO's
  dynamic sampling, Yu et al. 2025, arXiv:2503.14476).  Rates are
  re-estimated every ``period`` updates from the outcomes since the last
  estimate, so the kept set follows the improving policy; filtered-out
  prompts keep a small ``explore`` weight so they can come back.
  `in_band` is the per-batch version (DAPO's group filter).
* `PrioritizedLevelReplay` -- Jiang, Grefenstette & Rocktäschel (2021),
  "Prioritized Level Replay", arXiv:2010.03934.  Levels (generator seeds,
  i.e. rows of a task bank) are replayed with probability
  ``(1 - rho) * P_score + rho * P_staleness``: rank-based prioritisation of
  a learning-potential score (``learnability = p(1 - p)`` suits 0/1 outcome
  rewards; the paper uses the mean positive GAE) with temperature ``beta``,
  mixed with staleness so that every level's score is refreshed
  eventually.  Unseen levels are drawn with probability ``1 - replay_prob``.
* `hindsight_relabel` -- Andrychowicz et al. (2017), "Hindsight Experience
  Replay", arXiv:1707.01495: a failed attempt at goal ``g`` is a successful
  attempt at the goal it achieved, so relabelled transitions carry reward 1.
  For text tasks the goal lives in the prompt; `Countdown.relabel` rewrites
  the task around the value an answer reached.

``task_weights`` from `PassRateFilter.weights` / `PrioritizedLevelReplay.
distribution` go straight into ``TextEnvParams.task_weights``: the env's
reset samples from them, with no recompilation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


def in_band(successes: jax.Array, low: float = 0.3, high: float = 0.7) -> jax.Array:
    """bool [G]: groups (rows of ``successes [G, n]``, 0/1) whose pass rate lies in ``[low, high]``."""
    rate = jnp.mean(jnp.asarray(successes, jnp.float32), axis=-1)
    return (rate >= low) & (rate <= high)


def learnability(success_rate: jax.Array) -> jax.Array:
    """``p (1 - p)``: largest for prompts solved half the time, 0 for always/never solved."""
    return success_rate * (1.0 - success_rate)


@struct.dataclass
class PassRateState:
    successes: jax.Array  # float32 [N]: since the last estimate
    attempts: jax.Array  # float32 [N]: since the last estimate
    rate: jax.Array  # float32 [N]: the last estimate (NaN: never estimated)
    keep: jax.Array  # bool [N]
    updates: jax.Array  # int32: updates since the last estimate


class PassRateFilter:
    """Keeps tasks whose estimated success rate is in ``[low, high]``; see the module docstring.

    A task with fewer than ``min_attempts`` outcomes in a period keeps its
    previous estimate and decision (initially: kept, rate unknown).
    """

    def __init__(
        self,
        num_tasks: int,
        low: float = 0.3,
        high: float = 0.7,
        period: int = 10,
        min_attempts: int = 4,
        explore: float = 0.05,
    ):
        if not 0.0 <= low <= high <= 1.0:
            raise ValueError(f"need 0 <= low <= high <= 1, got [{low}, {high}]")
        self.num_tasks, self.low, self.high = num_tasks, low, high
        self.period, self.min_attempts, self.explore = period, min_attempts, explore

    def init(self) -> PassRateState:
        zeros = jnp.zeros((self.num_tasks,), jnp.float32)
        return PassRateState(
            zeros,
            zeros,
            jnp.full_like(zeros, jnp.nan),
            jnp.ones((self.num_tasks,), bool),
            jnp.int32(0),
        )

    def update(self, state: PassRateState, tasks: jax.Array, successes: jax.Array) -> PassRateState:
        """Adds outcomes (``successes`` in [0, 1] for each entry of ``tasks``); re-estimates
        every ``period``."""
        successes = state.successes.at[tasks].add(jnp.asarray(successes, jnp.float32))
        attempts = state.attempts.at[tasks].add(1.0)
        state = state.replace(successes=successes, attempts=attempts, updates=state.updates + 1)
        return jax.lax.cond(state.updates >= self.period, self.estimate, lambda s: s, state)

    def estimate(self, state: PassRateState) -> PassRateState:
        """Re-estimates rates from the outcomes gathered since the last estimate, then starts a new period."""
        enough = state.attempts >= self.min_attempts
        rate = jnp.where(enough, state.successes / jnp.maximum(state.attempts, 1.0), state.rate)
        keep = jnp.where(enough, (rate >= self.low) & (rate <= self.high), state.keep)
        zeros = jnp.zeros_like(state.successes)
        return PassRateState(zeros, zeros, rate, keep, jnp.int32(0))

    def weights(self, state: PassRateState) -> jax.Array:
        """Sampling weights: 1 for kept tasks, ``explore`` for the others."""
        return jnp.where(state.keep, 1.0, self.explore).astype(jnp.float32)


@struct.dataclass
class LevelReplayState:
    scores: jax.Array  # float32 [N]: the latest score of each level
    last_sampled: jax.Array  # int32 [N]: the round a level was last drawn
    seen: jax.Array  # bool [N]
    round: jax.Array  # int32: sampling rounds so far

    @property
    def staleness(self) -> jax.Array:
        return jnp.where(self.seen, self.round - self.last_sampled, 0)


class PrioritizedLevelReplay:
    """PLR over ``num_levels`` levels (Jiang et al., 2021); hyperparameters follow the paper's defaults."""

    def __init__(
        self, num_levels: int, beta: float = 0.1, rho: float = 0.1, replay_prob: float = 0.5
    ):
        if num_levels < 1 or not beta > 0 or not 0 <= rho <= 1 or not 0 <= replay_prob <= 1:
            raise ValueError(
                f"PrioritizedLevelReplay needs num_levels >= 1, beta > 0 and rho, replay_prob "
                f"in [0, 1]; got {num_levels}, {beta}, {rho}, {replay_prob}"
            )
        self.num_levels, self.beta, self.rho, self.replay_prob = num_levels, beta, rho, replay_prob

    def init(self) -> LevelReplayState:
        return LevelReplayState(
            jnp.zeros((self.num_levels,), jnp.float32),
            jnp.zeros((self.num_levels,), jnp.int32),
            jnp.zeros((self.num_levels,), bool),
            jnp.int32(0),
        )

    def replay_distribution(self, state: LevelReplayState) -> jax.Array:
        """``(1 - rho) P_S + rho P_C`` over seen levels: rank prioritisation
        ``(1/rank)^(1/beta)`` and staleness."""
        masked = jnp.where(state.seen, state.scores, -jnp.inf)
        rank = (
            jnp.empty_like(state.last_sampled)
            .at[jnp.argsort(-masked)]
            .set(jnp.arange(1, self.num_levels + 1))
        )
        by_score = jnp.where(state.seen, (1.0 / rank) ** (1.0 / self.beta), 0.0)
        stale = state.staleness.astype(jnp.float32)
        by_staleness = jnp.where(jnp.sum(stale) > 0, stale, state.seen.astype(jnp.float32))
        return (1 - self.rho) * by_score / jnp.sum(by_score) + self.rho * by_staleness / jnp.sum(
            by_staleness
        )

    def distribution(self, state: LevelReplayState) -> jax.Array:
        """Probability of drawing each level next: replay with ``replay_prob``, else an unseen level."""
        num_seen = jnp.sum(state.seen)
        unseen = (~state.seen).astype(jnp.float32) / jnp.maximum(self.num_levels - num_seen, 1)
        replay = jnp.where(num_seen > 0, self.replay_distribution(state), 0.0)
        replay_prob = jnp.where(
            num_seen == 0, 0.0, jnp.where(num_seen == self.num_levels, 1.0, self.replay_prob)
        )
        return replay_prob * replay + (1.0 - replay_prob) * unseen

    def sample(
        self, state: LevelReplayState, key: jax.Array, num: int
    ) -> tuple[LevelReplayState, jax.Array]:
        """Draws ``num`` levels and starts a new round (marks them seen and fresh)."""
        levels = jax.random.choice(key, self.num_levels, (num,), p=self.distribution(state))
        return self.mark_sampled(state, levels), levels

    def mark_sampled(self, state: LevelReplayState, levels: jax.Array) -> LevelReplayState:
        """Records a round in which ``levels`` were played (e.g. drawn by the env from `distribution`)."""
        round_ = state.round + 1
        return state.replace(
            last_sampled=state.last_sampled.at[levels].set(round_),
            seen=state.seen.at[levels].set(True),
            round=round_,
        )

    def update(
        self, state: LevelReplayState, levels: jax.Array, scores: jax.Array
    ) -> LevelReplayState:
        """Sets each played level's score to the mean of its new ``scores`` (several episodes
        may share one)."""
        total = jnp.zeros_like(state.scores).at[levels].add(jnp.asarray(scores, jnp.float32))
        count = jnp.zeros_like(state.scores).at[levels].add(1.0)
        return state.replace(
            scores=jnp.where(count > 0, total / jnp.maximum(count, 1.0), state.scores)
        )


def goal_reached(achieved: jax.Array, goal: jax.Array) -> jax.Array:
    """Default goal reward: 1.0 where every trailing component of ``achieved`` equals ``goal``."""
    equal = achieved == goal
    return jnp.all(equal.reshape(equal.shape[:1] + (-1,)), axis=1).astype(jnp.float32)


def hindsight_relabel(
    key: jax.Array,
    achieved: jax.Array,
    length=None,
    strategy: str = "future",
    reward_fn=goal_reached,
) -> tuple[jax.Array, jax.Array]:
    """Relabelled goals and rewards for one episode: ``(goals [T, ...], rewards [T])``.

    ``achieved[t]`` is the goal achieved after step ``t`` (the first
    ``length`` steps are real).  "final" substitutes the goal achieved at
    the end; "future" (the paper's best) the goal achieved at a uniformly
    drawn step ``t' >= t``.  Rewards are ``reward_fn(achieved, goals)``, so
    the step that achieved a substituted goal has reward 1.
    """
    steps = achieved.shape[0]
    last = steps - 1 if length is None else jnp.asarray(length) - 1
    t = jnp.arange(steps)
    if strategy == "final":
        source = jnp.full((steps,), last)
    elif strategy == "future":
        source = jnp.minimum(
            t + jax.random.randint(key, (steps,), 0, jnp.maximum(last - t + 1, 1)), last
        )
    else:
        raise ValueError(f"strategy must be 'final' or 'future', got {strategy!r}")
    goals = achieved[source]
    return goals, reward_fn(achieved, goals)
