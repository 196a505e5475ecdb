"""MCTS over reasoning steps: the language model as ``mctx``'s ``recurrent_fn``.

A node is a reasoning :class:`State`; its ``k`` actions are ``k`` next steps sampled from the
model when the node is created (so a uniform prior over them is the model's own policy, estimated
by sampling).  ``mctx`` holds node ids as embeddings; :class:`StepTree` keeps the states on the
host and is reached from inside ``jit`` through ``jax.pure_callback``.  Each simulation creates at
most one node per batch row, and all rows' new nodes sample their candidates in one decoder call.
A node is terminal when the turn ended or after ``max_steps`` steps: it pays ``reward(state)``
(a verifier, or an outcome reward model) with discount 0; a live node is valued by ``value``
(a value or process reward model; zeros for pure Monte Carlo search).  A child reached twice is
looked up, never sampled again, so the tree is the same whichever order mctx visits it in.

With ``reflect`` the search is LATS's (Zhou et al. 2023, "Language Agent Tree Search",
arXiv:2310.04406): a finished solution paid less than ``reflect_below`` gets a self-reflection
(``reflection.reflector``: the model's own account of what went wrong), and every node created
afterwards samples its candidates with the latest ``max_reflections`` reflections as context.

:func:`tree_search` is MCTS with the other searches' signature: one prompt in, a
``SearchResult`` out (the best-rewarded finished solution the tree holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gin
import jax
import jax.numpy as jnp
import mctx
import numpy as np

from agentic_jax.reasoning import mcts
from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.search import Scorer, SearchResult, _score
from agentic_jax.reasoning.steps import State, StepModel, root

MISSING = -1e9  # the prior logit of a candidate the budget or a terminal node did not sample


class StepTree:
    """The host side of an LM search: states, their sampled candidate steps, and the children
    already created, indexed by node id."""

    def __init__(
        self,
        model: StepModel,
        *,
        k: int,
        reward: Callable[[State], float],
        value: Scorer | None = None,
        max_steps: int = 8,
        temperature: float = 1.0,
        key=None,
        budget: Budget | None = None,
        reflect: Callable[[State, Budget], Sequence[int]] | None = None,
        reflect_below: float = 0.5,
        max_reflections: int = 3,
    ):
        if k < 1 or max_steps < 1:
            raise ValueError(f"need k >= 1 and max_steps >= 1, got {k} and {max_steps}")
        self.model, self.k, self.reward, self.value = model, k, reward, value
        self.max_steps, self.temperature = max_steps, temperature
        self.key = jax.random.key(0) if key is None else key
        self.budget = Budget() if budget is None else budget
        self.states: list[State] = []
        self.candidates: list[list[State]] = []
        self.children: dict[tuple[int, int], int] = {}
        self.rewards: dict[int, float] = {}  # a terminal node's reward, computed once
        self.expansions = 0  # decoder calls made
        self.reflect, self.reflect_below = reflect, reflect_below
        self.max_reflections = max_reflections
        self.reflections: list[tuple[int, ...]] = []  # token ids, oldest first

    def terminal(self, state: State) -> bool:
        return state.done or len(state.steps) >= self.max_steps

    def _add(self, states: Sequence[State]) -> list[int]:
        live = [s for s in states if not self.terminal(s)]
        if live:
            self.expansions += 1
            sampled = iter(
                self.model.expand(
                    live,
                    self.k,
                    key=jax.random.fold_in(self.key, len(self.states)),
                    temperature=self.temperature,
                    budget=self.budget,
                    context=self.context,
                )
            )
        ids = []
        for state in states:
            ids.append(len(self.states))
            self.states.append(state)
            self.candidates.append([] if self.terminal(state) else next(sampled))
        return ids

    @property
    def context(self) -> tuple[int, ...]:
        """What new nodes are sampled after: the latest reflections, oldest first."""
        recent = self.reflections[-self.max_reflections :] if self.max_reflections else []
        return sum(recent, ())

    def _reward(self, i: int) -> float:
        if i not in self.rewards:
            self.rewards[i] = float(self.reward(self.states[i]))
            if self.reflect is not None and self.rewards[i] < self.reflect_below:
                self.reflections.append(tuple(self.reflect(self.states[i], self.budget)))
        return self.rewards[i]

    def _priors(self, ids) -> np.ndarray:
        logits = np.full((len(ids), self.k), MISSING, np.float32)
        for row, i in enumerate(ids):
            logits[row, : len(self.candidates[i])] = 0.0
        return logits

    def _values(self, ids) -> np.ndarray:
        values = np.zeros(len(ids), np.float32)
        live = [row for row, i in enumerate(ids) if not self.terminal(self.states[i])]
        if live and self.value is not None:
            values[live] = self.value([self.states[ids[row]] for row in live])
        return values

    def root_output(self, prompts: Sequence[Sequence[int]]) -> mctx.RootFnOutput:
        """The roots of a batch of searches, one per prompt."""
        ids = self._add([root(p) for p in prompts])
        return mctx.RootFnOutput(
            prior_logits=jnp.asarray(self._priors(ids)),
            value=jnp.asarray(self._values(ids)),
            embedding=jnp.asarray(ids, jnp.int32),
        )

    def _step(self, action: np.ndarray, parent: np.ndarray):
        """The host callback: the children ``action`` leads to from ``parent`` (created if new)."""
        ids = np.zeros(len(action), np.int32)
        dead = np.zeros(len(action), bool)  # an action without a candidate: left at its parent
        fresh: list[tuple[int, State, tuple[int, int]]] = []
        for row, (a, p) in enumerate(zip(action.tolist(), parent.tolist())):
            if (p, a) in self.children:
                ids[row] = self.children[(p, a)]
            elif a < len(self.candidates[p]):
                fresh.append((row, self.candidates[p][a], (p, a)))
            else:
                ids[row], dead[row] = p, True
        for (row, _, edge), i in zip(fresh, self._add([s for _, s, _ in fresh])):
            ids[row] = self.children[edge] = i
        terminal = np.array([self.terminal(self.states[i]) for i in ids])
        done = terminal | dead
        reward = np.array(
            [self._reward(i) if t and not d else 0.0 for i, t, d in zip(ids, terminal, dead)],
            np.float32,
        )
        return (
            reward,
            np.where(done, 0.0, 1.0).astype(np.float32),
            self._priors(ids),
            np.where(done, 0.0, self._values(ids)).astype(np.float32),
            ids,
        )

    def recurrent_fn(self, params, key, action, embedding):
        """``mctx``'s recurrent function; ``params`` and ``key`` are unused (the model and the
        sampling keys live in the tree)."""
        b = action.shape[0]
        shapes = (
            jax.ShapeDtypeStruct((b,), jnp.float32),
            jax.ShapeDtypeStruct((b,), jnp.float32),
            jax.ShapeDtypeStruct((b, self.k), jnp.float32),
            jax.ShapeDtypeStruct((b,), jnp.float32),
            jax.ShapeDtypeStruct((b,), jnp.int32),
        )
        reward, discount, prior, value, child = jax.pure_callback(
            lambda a, e: self._step(np.asarray(a), np.asarray(e)), shapes, action, embedding
        )
        out = mctx.RecurrentFnOutput(
            reward=reward, discount=discount, prior_logits=prior, value=value
        )
        return out, child


def _most_visited_end(tree: mctx.Tree) -> int:
    """The node (its ``StepTree`` id) that following the most visited child from the root of
    batch row 0 ends at."""
    children = np.asarray(tree.children_index[0])
    visits = np.asarray(tree.node_visits[0])
    node = mctx.Tree.ROOT_INDEX
    while (kids := children[node][children[node] != mctx.Tree.UNVISITED]).size:
        node = int(kids[np.argmax(visits[kids])])
    return int(np.asarray(tree.embeddings[0])[node])


@gin.configurable(module="reasoning", denylist=["model", "prompt", "score", "key", "budget"])
def tree_search(
    model: StepModel,
    prompt: Sequence[int] | State,
    score: Scorer,
    *,
    key,
    k: int = 4,
    simulations: int = 32,
    max_steps: int = 8,
    policy: str = "muzero",
    temperature: float = 1.0,
    reward: Callable[[State], float] | None = None,
    reflect: Callable[[State, Budget], Sequence[int]] | None = None,
    budget: Budget | None = None,
) -> SearchResult:
    """MCTS over steps (``mcts.search`` on a :class:`StepTree`) from one prompt; with
    ``reflect``, LATS (see the module docstring).

    ``score`` values live nodes (a PRM) and, unless ``reward`` is given (a verifier), pays
    finished ones too (an outcome reward model).  ``candidates`` are the finished solutions the
    tree reached, valued by that reward; if it reached none, the end of its most visited path
    is completed greedily (within the budget) and is the only candidate.
    """
    budget = Budget() if budget is None else budget
    reward = reward or (lambda state: float(_score(score, [state])[0]))
    key, search_key = jax.random.split(key)
    tree = StepTree(
        model,
        k=k,
        reward=reward,
        value=score,
        max_steps=max_steps,
        temperature=temperature,
        key=key,
        budget=budget,
        reflect=reflect,
    )
    out = mcts.search(
        None,
        search_key,
        tree.root_output([prompt]),
        tree.recurrent_fn,
        num_simulations=simulations,
        policy=policy,
        max_depth=max_steps,
    )
    finished = sorted(tree.rewards)  # node ids: in the order they were created
    candidates = [tree.states[i] for i in finished]
    values = np.array([tree.rewards[i] for i in finished])
    if not candidates:
        end = tree.states[_most_visited_end(out.search_tree)]
        rest = max_steps - len(end.steps) + len(root(prompt).steps)
        (end,) = model.complete(
            [end], key=key, temperature=0.0, max_steps=max(rest, 0), budget=budget
        )
        candidates, values = [end], np.array([reward(end)])
    return SearchResult(candidates[int(np.argmax(values))], candidates, values, budget)
