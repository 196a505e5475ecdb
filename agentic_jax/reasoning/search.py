"""Search over reasoning steps scored by a process reward model: step beam search and DVTS.

Both grow independent *groups* of partial solutions one level at a time, every group's
expansions in one batched decoder call.  A child's value is its path's step scores (the scorer
applied to each prefix as it was generated) aggregated by ``rl.aggregate_steps`` (``last``,
``min``, ``product`` or ``mean``), so a PRM is called once per new step, never on old ones.

* :func:`step_beam_search`: one group of ``width`` beams, each expanded into ``expansions``
  sampled steps; the ``width`` best of the pool survive, a finished solution staying while it
  scores in the top ``width`` (Snell et al. 2024, arXiv:2408.03314, Sec. 5).
* DVTS, :func:`step_beam_search` with ``subtrees=N, width=1``: N groups rooted at distinct
  sampled first steps, each expanded greedily by the PRM, so that the budget is not spent on
  near-copies of one early prefix (Beeching et al. 2024, "Scaling test-time compute").

A search stops when every kept state is terminal, after ``max_steps`` levels, or when the
budget cannot pay for another sampled step.  Ties in score keep the earlier candidate (parents
in order, their children in sampling order): width 1 with one expansion at temperature 0 is
greedy step-by-step decoding.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax import rl
from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.selection import best_of_n
from agentic_jax.reasoning.steps import State, StepModel, root

Scorer = Callable[[Sequence[State]], np.ndarray]


class SearchResult(NamedTuple):
    """The chosen state, the final candidates (with their aggregated values) it was chosen
    from, and the budget with what was spent."""

    best: State
    candidates: list[State]
    values: np.ndarray
    budget: Budget


def policy_rows(
    states: Sequence[State], pad_id: int = 0, width: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ``tokens [B, width]`` (default: the longest state) and a ``mask`` over the
    policy's tokens: the generated tokens; for an episode's state (``TurnModel``), only the
    policy's own turns, not the tool messages (the episode's loss mask)."""
    width = max(len(s.tokens) for s in states) if width is None else width
    tokens = np.full((len(states), width), pad_id, np.int32)
    mask = np.zeros((len(states), width), np.int32)
    for row, state in enumerate(states):
        end = len(state.tokens)
        tokens[row, :end] = state.tokens
        if state.episode is None:
            mask[row, state.prompt_length : end] = 1
        else:
            mask[row, :end] = state.episode.loss_mask[0, :end]
    return tokens, mask


def token_scorer(score_tokens: Callable, pad_id: int = 0) -> Scorer:
    """A :data:`Scorer` from a function of :func:`policy_rows`' ``tokens`` and ``mask``, such
    as a trained reward model's ``scores`` or ``episode_rewards``."""

    def score(states: Sequence[State]) -> np.ndarray:
        return np.asarray(score_tokens(*policy_rows(states, pad_id)), np.float64)

    return score


def _score(score: Scorer, states: Sequence[State]) -> np.ndarray:
    """``score(states)`` as float64 ``[len(states)]``, checked (an empty list is not scored)."""
    if not states:
        return np.zeros(0)
    values = np.asarray(score(states), np.float64)
    if values.shape != (len(states),):
        raise ValueError(f"the scorer returned shape {values.shape} for {len(states)} states")
    return values


def _padded(paths: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [N, S], mask [N, S])`` from one list of step scores per solution."""
    depth = max((len(p) for p in paths), default=0)
    scores = np.zeros((len(paths), max(depth, 1)), np.float32)
    mask = np.zeros_like(scores)
    for row, path in enumerate(paths):
        scores[row, : len(path)] = path
        mask[row, : len(path)] = 1.0
    return scores, mask


def step_scores(score: Scorer, states: Sequence[State]) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [N, S], mask [N, S])``: ``score`` on every prefix of each state that ends a
    step, in one scorer call.  With ``rl.aggregate_steps`` and :func:`best_of_n` this is
    best-of-N by a process reward model (``min``, ``product``, ``last`` or ``mean``)."""
    prefixes = []
    for state in states:
        ends = state.prompt_length + np.cumsum([len(step) for step in state.steps], dtype=int)
        # A prefix keeps the whole transcript's episode: its loss mask, cut to the prefix, is
        # the prefix's own.
        prefixes.append(
            [
                State(
                    state.tokens[:end],
                    state.prompt_length,
                    state.steps[: i + 1],
                    episode=state.episode,
                )
                for i, end in enumerate(ends)
            ]
        )
    values = iter(_score(score, [p for row in prefixes for p in row]))
    return _padded([[next(values) for _ in row] for row in prefixes])


class _Node(NamedTuple):
    state: State
    path: tuple[float, ...]  # the scorer's value after each of the state's steps


def _values(nodes: Sequence[_Node], aggregation: str) -> np.ndarray:
    """Each node's path of step scores, aggregated (0 for a node with no scored step)."""
    if not nodes:
        return np.zeros(0)
    scores, mask = _padded([n.path for n in nodes])
    return np.asarray(rl.aggregate_steps(jnp.asarray(scores), jnp.asarray(mask), aggregation))


def _scored_children(score: Scorer, parents: Sequence[_Node], children) -> list[list[_Node]]:
    it = iter(_score(score, [c for kids in children for c in kids]))
    return [
        [_Node(c, p.path + (float(next(it)),)) for c in kids] for p, kids in zip(parents, children)
    ]


def _grow(
    model, groups, score, *, key, width, expansions, max_steps, temperature, aggregation, budget
):
    """Grows every group of nodes level by level; returns the final groups."""
    for depth in range(max_steps):
        flat = [n for group in groups for n in group]
        if all(n.state.done for n in flat):
            break
        children = model.expand(
            [n.state for n in flat],
            expansions,
            key=jax.random.fold_in(key, depth),
            temperature=temperature,
            budget=budget,
        )
        if not any(children):
            break
        scored = iter(_scored_children(score, flat, children))
        new_groups = []
        for group in groups:
            pool = []
            for node in group:
                kids = next(scored)
                # A finished node, or one the budget left unexpanded, competes as it is.
                pool.extend([node] if node.state.done or not kids else kids)
            order = np.argsort(-_values(pool, aggregation), kind="stable")[:width]
            new_groups.append([pool[i] for i in order])
        groups = new_groups
    return groups


def _result(groups, aggregation: str, budget: Budget) -> SearchResult:
    final = [n for group in groups for n in group]
    values = _values(final, aggregation)
    return SearchResult(
        final[int(best_of_n(values))].state, [n.state for n in final], values, budget
    )


def _check(**counts):
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


@gin.configurable(module="reasoning", denylist=["model", "prompt", "score", "key", "budget"])
def step_beam_search(
    model: StepModel,
    prompt: Sequence[int],
    score: Scorer,
    *,
    key,
    width: int = 4,
    expansions: int = 4,
    subtrees: int = 1,
    max_steps: int = 16,
    temperature: float = 1.0,
    aggregation: str = "last",
    budget: Budget | None = None,
) -> SearchResult:
    """Step-level beam search scored by ``score`` (see the module docstring).

    ``subtrees`` > 1 first samples that many first steps and grows a beam of ``width`` under
    each, independently; ``subtrees=N, width=1`` is DVTS.
    """
    _check(width=width, expansions=expansions, subtrees=subtrees)
    budget = Budget() if budget is None else budget
    start = _Node(root(prompt), ())
    groups = [[start]]
    if subtrees > 1:
        key, first_key = jax.random.split(key)
        first = model.expand(
            [start.state], subtrees, key=first_key, temperature=temperature, budget=budget
        )
        groups = [[node] for node in _scored_children(score, [start], first)[0]] or groups
        max_steps -= 1
    groups = _grow(
        model,
        groups,
        score,
        key=key,
        width=width,
        expansions=expansions,
        max_steps=max_steps,
        temperature=temperature,
        aggregation=aggregation,
        budget=budget,
    )
    return _result(groups, aggregation, budget)


def rollout_scorer(
    model: StepModel,
    reward: Callable[[State], float],
    *,
    key,
    temperature: float = 1.0,
    max_steps: int = 16,
    budget: Budget | None = None,
) -> Scorer:
    """A state's value by a rollout to a terminal verifier, MCTS's classic evaluation: each
    state is completed once by the model (one batched call per step, charged to ``budget``)
    and the completion is paid ``reward``.  Every call of the scorer draws fresh rollouts."""
    calls = itertools.count()

    def score(states: Sequence[State]) -> np.ndarray:
        ends = model.complete(
            states,
            key=jax.random.fold_in(key, next(calls)),
            temperature=temperature,
            max_steps=max_steps,
            budget=budget,
        )
        return np.array([reward(s) for s in ends], np.float64)

    return score
