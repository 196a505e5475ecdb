"""Search over reasoning steps scored by a process reward model: step-level beam search.

Snell et al. 2024 (arXiv:2408.03314), Sec. 5: keep the ``width`` best partial solutions; expand
each into ``expansions`` sampled next steps in one batched call; score every child by the PRM
(or any ``score`` callable over states); a finished solution competes with the live ones and
stays in the beam while it scores in the top ``width``.  It stops when every kept state is
terminal, after ``max_steps`` levels, or when the budget cannot pay for another level.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import numpy as np

from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.selection import best_of_n
from agentic_jax.reasoning.steps import State, StepModel, root

Scorer = Callable[[Sequence[State]], np.ndarray]


class SearchResult(NamedTuple):
    """The chosen state, the final candidates it was chosen from, and what was spent."""

    best: State
    candidates: list[State]
    budget: Budget


def _scores(score: Scorer, states: Sequence[State]) -> np.ndarray:
    scores = np.asarray(score(states), np.float64)
    if scores.shape != (len(states),):
        raise ValueError(f"the scorer returned shape {scores.shape} for {len(states)} states")
    return scores


def step_beam_search(
    model: StepModel,
    prompt: Sequence[int],
    score: Scorer,
    *,
    key,
    width: int = 4,
    expansions: int = 4,
    max_steps: int = 16,
    temperature: float = 1.0,
    budget: Budget | None = None,
) -> SearchResult:
    """Beam search over steps; ties in score keep the earlier candidate (parents in beam
    order, their children in sampling order), so width 1 with one expansion at temperature 0
    is greedy step-by-step decoding."""
    if width < 1 or expansions < 1:
        raise ValueError(f"width and expansions must be >= 1, got {width} and {expansions}")
    budget = Budget() if budget is None else budget
    beam, beam_scores = [root(prompt)], np.zeros(1)
    for depth in range(max_steps):
        if all(s.done for s in beam):
            break
        children = model.expand(
            beam,
            expansions,
            key=jax.random.fold_in(key, depth),
            temperature=temperature,
            budget=budget,
        )
        if not any(children):
            break
        fresh = [c for kids in children for c in kids]
        fresh_scores = iter(_scores(score, fresh))
        pool, pool_scores = [], []
        for state, value, kids in zip(beam, beam_scores, children):
            if state.done or not kids:  # finished, or left unexpanded by the budget
                pool.append(state)
                pool_scores.append(value)
            else:
                pool.extend(kids)
                pool_scores.extend(next(fresh_scores) for _ in kids)
        order = np.argsort(-np.asarray(pool_scores), kind="stable")[:width]
        beam = [pool[i] for i in order]
        beam_scores = np.asarray(pool_scores)[order]
    return SearchResult(beam[int(best_of_n(beam_scores))], beam, budget)
