"""Tree-of-Thoughts depth-first search, and the model voting for the most promising thought.

Yao et al. 2023, "Tree of Thoughts" (arXiv:2305.10601).  Breadth-first ToT is
:func:`~agentic_jax.reasoning.search.step_beam_search` with a value scorer (its ``width`` best
thoughts survive each level).  Depth-first ToT, here, expands the most promising thought first,
drops children whose value is below ``threshold`` (pruning), and backtracks when a branch is
exhausted; it stops at the first finished solution the ``accept`` test passes, when the budget
is spent, or after ``max_expansions``.  DFS is sequential by nature: one decoder call per
expanded node.

A *vote* evaluator (ToT's for tasks without a natural value) asks the model itself which of
several candidates is best, ``votes`` times, and scores each by its share of the votes; a
*self-evaluation* value asks it whether each state is on track and reads P(yes).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence

import gin
import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.inference.decoding.prompts import check_token_ids
from agentic_jax.models import forward
from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.search import (
    Scorer,
    SearchResult,
    _check,
    _Node,
    _scored_children,
    _values,
)
from agentic_jax.reasoning.steps import PAD_MULTIPLE, State, StepModel, root


@gin.configurable(module="reasoning", denylist=["model", "prompt", "score", "key", "budget"])
def depth_first_search(
    model: StepModel,
    prompt: Sequence[int],
    score: Scorer,
    *,
    key,
    expansions: int = 4,
    threshold: float = 0.5,
    max_steps: int = 16,
    max_expansions: int = 64,
    temperature: float = 1.0,
    aggregation: str = "last",
    accept: Callable[[State], bool] | None = None,
    budget: Budget | None = None,
) -> SearchResult:
    """Depth-first ToT (see the module docstring).  ``candidates`` are the finished solutions
    met, in order; ``best`` is the accepted one, else the best-valued finished one, else the
    best-valued partial state the search reached."""
    _check(expansions=expansions, max_expansions=max_expansions)
    budget = Budget() if budget is None else budget
    stack, finished, seen, accepted = [_Node(root(prompt), ())], [], [], None
    count = 0  # expansions made; once they are all spent, the stack's finished nodes still count
    while stack:
        node = stack.pop()
        seen.append(node)
        if node.state.done or len(node.state.steps) >= max_steps:
            finished.append(node)
            if accept is None or accept(node.state):
                accepted = node
                break
            continue
        if count == max_expansions:
            continue
        (kids,) = model.expand(
            [node.state],
            expansions,
            key=jax.random.fold_in(key, count),
            temperature=temperature,
            budget=budget,
        )
        count += 1
        if not kids:
            break  # the budget is spent
        children = _scored_children(score, [node], [kids])[0]
        values = _values(children, aggregation)
        kept = [i for i, v in enumerate(values) if v >= threshold]
        # The best is pushed last, so it is expanded next; of equal values, the earlier sample.
        stack.extend(children[i] for i in sorted(kept, key=lambda i: (values[i], -i)))
    values = _values(finished, aggregation)
    if accepted is not None:
        best = accepted.state
    elif finished:
        best = finished[int(np.argmax(values))].state
    else:
        best = seen[int(np.argmax(_values(seen, aggregation)))].state
    return SearchResult(best, [n.state for n in finished], values, budget)


@gin.configurable(module="reasoning", denylist=["model", "key"])
def vote_scorer(
    model: StepModel,
    render: Callable[[Sequence[State]], Sequence[int]],
    *,
    key,
    votes: int = 5,
    temperature: float = 1.0,
    budget: Budget | None = None,
) -> Scorer:
    """A scorer that asks the model which candidate is best: ``render(candidates)`` is the
    prompt (listing them as 1..n), the first integer of each of ``votes`` sampled answers is a
    vote, and a candidate's score is its share of the ``votes`` (invalid answers vote for none).
    """
    if votes < 1:
        raise ValueError(f"votes must be >= 1, got {votes}")
    calls = itertools.count()

    def score(states: Sequence[State]) -> np.ndarray:
        answers = model.complete(
            [root(render(states))] * votes,
            key=jax.random.fold_in(key, next(calls)),
            temperature=temperature,
            max_steps=1,
            budget=budget,
        )
        counts = np.zeros(len(states))
        for answer in answers:
            found = re.search(r"\d+", model.text(answer.generated))
            if found and 1 <= int(found.group()) <= len(states):
                counts[int(found.group()) - 1] += 1
        return counts / votes

    return score


_forward = jax.jit(forward, static_argnums=1)


@gin.configurable(module="reasoning", denylist=["model", "render"])
def self_evaluation_scorer(
    model: StepModel,
    render: Callable[[State], Sequence[int]],
    *,
    yes: str = "yes",
    no: str = "no",
) -> Scorer:
    """ToT's value prompt: the model judges each state itself (Yao et al. 2023).

    ``render(state)`` is a prompt asking whether the partial solution is on track, answered by
    one token; the score is ``P(yes) / (P(yes) + P(no))`` from the model's next-token
    distribution, one forward pass over all states (no sampling, so nothing is charged).
    """
    ids = []
    for word in (yes, no):
        encoded = model.tokenizer.encode(word)
        if len(encoded) != 1:
            raise ValueError(f"{word!r} must be one token of the tokenizer, it is {encoded}")
        ids.append(encoded[0])

    def score(states: Sequence[State]) -> np.ndarray:
        prompts = [tuple(render(s)) for s in states]
        check_token_ids(prompts, model.config.vocab_size)
        longest = max(map(len, prompts))
        width = -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE  # a few shapes, a few compilations
        if width > model.config.max_seq_len:
            raise ValueError(f"a rendered state has {longest} tokens > max_seq_len")
        tokens = np.zeros((len(prompts), width), np.int32)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = prompt
        logits = np.asarray(_forward(model.params, model.config, jnp.asarray(tokens)))
        last = logits[np.arange(len(prompts)), [len(p) - 1 for p in prompts]]
        return 1.0 / (1.0 + np.exp(last[:, ids[1]] - last[:, ids[0]]))

    return score
