"""The read policy: which memories to put before the model, within a token budget.

**Score** (Park, O'Brien, Cai, Morris, Liang & Bernstein 2023, *Generative Agents: Interactive
Simulacra of Human Behavior*, §4.1).  Each candidate memory ``m`` for a query ``q`` gets

    score(m) = w_rel · n(relevance) + w_rec · n(recency) + w_imp · n(importance)

where relevance is the cosine similarity of the embeddings of ``q`` and ``m``, recency is
``decay ** hours`` since ``m`` was last accessed (an exponential forgetting curve; the paper's
``decay`` is 0.995 an hour), importance is the write policy's 1-10 score, and ``n`` is min-max
normalisation over the candidates, ``n(x) = (x − min x) / (max x − min x)``, so each term spans
[0, 1] and the weights alone say how much each counts (a term equal for every candidate is 0:
it cannot rank them).  The paper weights all three 1.  Candidates are the ``candidates``
records most relevant to the query (``None``: all of them, as in the paper).

**Diversity** (``mmr=λ``): maximal marginal relevance (Carbonell & Goldstein 1998, *The Use of
MMR, Diversity-Based Reranking for Reordering Documents and Producing Summaries*) picks, one by
one, ``argmax_m λ · score(m) − (1 − λ) · max_{s ∈ S} cos(m, s)`` over the memories not yet
picked, ``S`` those picked: five paraphrases of one fact cost a budget that five facts would
use better.  Without it the order is by score (ties by relevance).

**Budget.**  Memories are taken in that order while they fit ``budget`` tokens (their texts
counted by ``count``: a callable, or a tokenizer's ``encode``; default four characters a
token); one that does not fit is skipped and the next tried, so the total never exceeds the
budget.  ``k`` caps the number returned.  Reading is an access: the memories returned get
``accessed_at = now``, so what is used stays fresh (Park et al.'s retrieval updates the last
access time too).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import gin
import numpy as np

from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.write import Embed

HOUR = 3600.0


def approx_tokens(text: str) -> int:
    """About four characters a token (the estimate ``agents.context.tokens`` uses)."""
    return math.ceil(len(text) / 4)


def token_counter(count) -> Callable[[str], int]:
    """A ``text -> tokens`` function from a callable or anything with ``encode`` (a
    tokenizer); ``None`` gives :func:`approx_tokens`."""
    if count is None:
        return approx_tokens
    if hasattr(count, "encode"):
        return lambda text: len(count.encode(text))
    if not callable(count):
        raise TypeError(f"count is a callable or a tokenizer, got {type(count).__name__}")
    return count


def min_max(x: np.ndarray) -> np.ndarray:
    """``(x − min) / (max − min)``; zeros when ``x`` is constant."""
    span = x.max() - x.min() if len(x) else 0.0
    return (x - x.min()) / span if span > 0 else np.zeros_like(x)


def mmr_order(scores: np.ndarray, vectors: np.ndarray, lam: float, fits: Callable[[int], bool]):
    """Indices picked by maximal marginal relevance (module docstring) among those ``fits``
    accepts when their turn comes (it is asked once per index, in picking order); ``lam = 1``
    is plain score order.  Ties go to the lower index."""
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    closest = np.full(len(scores), -np.inf)  # max cosine to a picked memory
    left = np.ones(len(scores), bool)
    while left.any():
        penalty = np.where(np.isfinite(closest), closest, 0.0)
        value = np.where(left, lam * scores - (1 - lam) * penalty, -np.inf)
        best = int(np.argmax(value))
        left[best] = False
        if fits(best):
            yield best
            if lam < 1:
                closest = np.maximum(closest, unit @ unit[best])


@dataclasses.dataclass(frozen=True)
class Recall:
    """A memory read, with its score and the raw terms it came from (relevance is the cosine,
    recency ``decay ** hours``, importance as stored)."""

    record: MemoryRecord
    score: float
    relevance: float
    recency: float
    importance: float


@gin.configurable(module="memory")
class MemoryReader:
    """Reads ``store`` by the policy of the module docstring.  ``embed`` (texts to vectors)
    lets :meth:`read` take a text query; any query may be a vector."""

    def __init__(
        self,
        store: MemoryStore,
        embed: Embed | None = None,
        *,
        relevance_weight: float = 1.0,
        recency_weight: float = 1.0,
        importance_weight: float = 1.0,
        decay: float = 0.995,
        budget: int | None = 512,
        count=None,
        k: int | None = None,
        mmr: float | None = None,
        candidates: int | None = 100,
    ):
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if mmr is not None and not 0 <= mmr <= 1:
            raise ValueError(f"mmr (λ) must be in [0, 1], got {mmr}")
        self.store, self.embed = store, embed
        self.weights = np.array([relevance_weight, recency_weight, importance_weight])
        self.decay, self.budget, self.k, self.mmr = decay, budget, k, mmr
        self.count = token_counter(count)
        self.candidates = candidates

    def read(
        self,
        query,
        *,
        user: str | None = None,
        types: Sequence[str] | None = None,
        now: float | None = None,
    ) -> list[Recall]:
        """The memories of ``user`` (of ``types``, valid now) to show for ``query`` (a text or
        an embedding), best first; they are marked accessed at ``now`` (default: the store's
        clock)."""
        if isinstance(query, str):
            if self.embed is None:
                raise ValueError("a text query needs the reader's embed function")
            query = np.asarray(self.embed([query]))[0]
        now = self.store.clock() if now is None else now
        found = self.store.search(
            query, self.candidates, user=user, types=types, valid_at=now, known_at=now
        )
        if not found:
            return []
        records = [r for r, _ in found]
        relevance = np.array([s for _, s in found], np.float64)
        hours = np.array([max(now - r.accessed_at, 0.0) / HOUR for r in records])
        recency = self.decay**hours
        importance = np.array([r.importance for r in records], np.float64)
        terms = np.stack([min_max(relevance), min_max(recency), min_max(importance)])
        scores = self.weights @ terms
        room = math.inf if self.budget is None else self.budget

        def fits(i: int) -> bool:
            nonlocal room
            cost = self.count(records[i].text)
            if cost > room:
                return False
            room -= cost
            return True

        vectors = np.stack([r.embedding for r in records])
        picked = []
        for i in mmr_order(scores, vectors, 1.0 if self.mmr is None else self.mmr, fits):
            picked.append(
                Recall(
                    records[i],
                    float(scores[i]),
                    float(relevance[i]),
                    float(recency[i]),
                    float(importance[i]),
                )
            )
            if len(picked) == self.k:
                break
        self.store.touch([p.record.id for p in picked], now)
        return picked
