"""Self-reflection on a failed solution, the memory LATS searches with.

Reflexion (Shinn et al. 2023, arXiv:2303.11366) and LATS (Zhou et al. 2023, arXiv:2310.04406):
after a failed attempt the model writes, in words, what went wrong; later attempts are sampled
with those reflections in their context.  :func:`reflector` makes the ``reflect`` function that
``StepTree`` and ``tree_search`` call on each finished solution paid below their threshold.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.steps import State, StepModel, root


def reflector(
    model: StepModel,
    render: Callable[[State], Sequence[int]],
    *,
    wrap: Callable[[Sequence[int]], Sequence[int]] | None = None,
    max_steps: int = 1,
    key=None,
) -> Callable[[State, Budget], tuple[int, ...]]:
    """``reflect(state, budget)``: the model's greedy continuation (at most ``max_steps``
    steps, charged to ``budget``) of ``render(state)`` (token ids of a prompt showing the failed
    attempt and asking what went wrong), passed through ``wrap`` (e.g. rendering it as a system
    message) to become the context later expansions see."""
    key = jax.random.key(0) if key is None else key

    def reflect(state: State, budget: Budget) -> tuple[int, ...]:
        (done,) = model.complete(
            [root(render(state))], key=key, temperature=0.0, max_steps=max_steps, budget=budget
        )
        words = done.generated
        return tuple(int(t) for t in (words if wrap is None else wrap(words)))

    return reflect
