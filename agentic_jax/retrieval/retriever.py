"""What every retriever answers: ranked hits by chunk id, so any retrievers can be fused, stacked
or handed to an agent without knowing what scored them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple, Protocol, runtime_checkable


class Hit(NamedTuple):
    """One retrieved chunk: its id, the retriever's score (comparable only within one ranking)
    and its rank, 1 for the best."""

    id: str
    score: float
    rank: int


@runtime_checkable
class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Hit]:
        """The (at most) ``k`` best hits for ``query``, best first."""


def ranked(scored: Iterable[tuple[str, float]]) -> list[Hit]:
    """Hits from ``(id, score)`` pairs already in rank order."""
    return [Hit(str(i), float(s), rank) for rank, (i, s) in enumerate(scored, 1)]


def check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")


class ParentRetriever:
    """Small-to-big retrieval: search the children (small chunks match a query precisely) and
    return their parents (large chunks give the reader context).  A parent scores and ranks as
    its best child; children are fetched in doubling batches until ``k`` parents are found or
    the children run out, so the answer is the same as ranking every child first."""

    def __init__(self, children: Retriever, parent_of: Mapping[str, str]):
        self.children, self.parent_of = children, parent_of

    def search(self, query: str, k: int) -> list[Hit]:
        check_k(k)
        fetch = k
        while True:
            hits = self.children.search(query, fetch)
            best: dict[str, float] = {}
            for hit in hits:
                best.setdefault(self.parent_of[hit.id], hit.score)
            if len(best) >= k or len(hits) < fetch:
                return ranked(list(best.items())[:k])
            fetch *= 2
