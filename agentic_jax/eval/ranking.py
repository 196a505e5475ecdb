"""Ranking and retrieval metrics of one ranked list against its relevant items.

``ranking`` is a list of ids best first; ``relevant`` a set of ids, or for nDCG a dict of
graded gains.  The mean over queries of each is the usual retrieval report (MRR, MAP).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def recall_at_k(ranking: Sequence, relevant: set, k: int) -> float:
    """The fraction of relevant items in the top ``k`` (0 when nothing is relevant)."""
    _check_k(k)
    return len(set(ranking[:k]) & set(relevant)) / len(relevant) if relevant else 0.0


def precision_at_k(ranking: Sequence, relevant: set, k: int) -> float:
    """The fraction of the top ``k`` positions holding a relevant item."""
    _check_k(k)
    return sum(item in relevant for item in ranking[:k]) / k


def reciprocal_rank(ranking: Sequence, relevant: set) -> float:
    """``1 / rank`` of the first relevant item, 0 when none is ranked."""
    return next((1.0 / rank for rank, item in enumerate(ranking, 1) if item in relevant), 0.0)


def mean_reciprocal_rank(rankings: Sequence[Sequence], relevants: Sequence[set]) -> float:
    if len(rankings) != len(relevants) or not rankings:
        raise ValueError(f"need equal, non-zero counts: {len(rankings)} and {len(relevants)}")
    return float(np.mean([reciprocal_rank(r, s) for r, s in zip(rankings, relevants)]))


def ndcg_at_k(ranking: Sequence, gains: Mapping, k: int) -> float:
    """nDCG@k (Järvelin and Kekäläinen 2002): DCG with gain ``2^g - 1`` and discount
    ``log2(rank + 1)``, over the DCG of the ideal order of ``gains``; 0 without positive gains."""
    _check_k(k)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    got = np.array([2.0 ** gains.get(item, 0.0) - 1 for item in ranking[:k]])
    ideal = np.sort([2.0**g - 1 for g in gains.values()])[::-1][:k]
    best = float(ideal @ discount[: len(ideal)])
    return float(got @ discount[: len(got)]) / best if best > 0 else 0.0


def average_precision(ranking: Sequence, relevant: set) -> float:
    """The mean of precision@rank over the ranks of relevant items, divided by all relevant
    items (unranked ones count as 0)."""
    if not relevant:
        return 0.0
    hits, total = 0, 0.0
    for rank, item in enumerate(ranking, 1):
        if item in relevant:
            hits += 1
            total += hits / rank
    return total / len(relevant)


def mean_average_precision(rankings: Sequence[Sequence], relevants: Sequence[set]) -> float:
    if len(rankings) != len(relevants) or not rankings:
        raise ValueError(f"need equal, non-zero counts: {len(rankings)} and {len(relevants)}")
    return float(np.mean([average_precision(r, s) for r, s in zip(rankings, relevants)]))
