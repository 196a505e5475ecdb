"""Ranking and retrieval metrics of ranked lists against their relevant items.

Retrieval for an agent (documents, tools, memories) is judged by where the relevant items land
in the ranked list it gets back.  These are the standard TREC-style definitions, written out so
that their conventions are explicit: ``ranking`` is a sequence of distinct ids, best first;
``relevant`` is a collection of ids (binary relevance) and ``gains`` a mapping of ids to graded
relevance for nDCG; relevant items missing from the ranking count as never retrieved.  The
means over queries (MRR, MAP) are plain averages, one query one vote.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping, Sequence
from numbers import Real


def _check_ranking(ranking: Sequence[Hashable]) -> None:
    if isinstance(ranking, str) or not isinstance(ranking, Sequence):
        raise TypeError(f"ranking must be a sequence of ids, got {type(ranking).__name__}")
    if len(set(ranking)) != len(ranking):
        repeated = sorted({repr(item) for item in ranking if ranking.count(item) > 1})
        raise ValueError(f"ranking lists an id more than once: {', '.join(repeated)}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def _relevant_set(relevant: Collection[Hashable], *, required: bool, metric: str) -> set:
    if isinstance(relevant, str):
        raise TypeError("relevant must be a collection of ids, not a single str")
    relevant = set(relevant)
    if required and not relevant:
        raise ValueError(f"relevant is empty: {metric} is undefined without relevant items")
    return relevant


def recall_at_k(ranking: Sequence[Hashable], relevant: Collection[Hashable], k: int) -> float:
    """``|top-k ∩ relevant| / |relevant|``: the fraction of relevant items retrieved in the
    first ``k`` positions.  ``relevant`` must not be empty."""
    _check_ranking(ranking)
    _check_k(k)
    relevant = _relevant_set(relevant, required=True, metric="recall")
    return len(relevant.intersection(ranking[:k])) / len(relevant)


def precision_at_k(ranking: Sequence[Hashable], relevant: Collection[Hashable], k: int) -> float:
    """``|top-k ∩ relevant| / k``: the fraction of the first ``k`` positions that hold a
    relevant item (positions past the end of a short ranking count as misses)."""
    _check_ranking(ranking)
    _check_k(k)
    relevant = _relevant_set(relevant, required=False, metric="precision")
    return len(relevant.intersection(ranking[:k])) / k


def reciprocal_rank(ranking: Sequence[Hashable], relevant: Collection[Hashable]) -> float:
    """``1 / rank`` of the first relevant item (ranks from 1), 0 when none is ranked."""
    _check_ranking(ranking)
    relevant = _relevant_set(relevant, required=False, metric="reciprocal rank")
    return next((1.0 / rank for rank, item in enumerate(ranking, 1) if item in relevant), 0.0)


def _check_queries(rankings: Sequence, relevants: Sequence) -> None:
    if len(rankings) != len(relevants):
        raise ValueError(
            f"rankings and relevants have different lengths: {len(rankings)} rankings but "
            f"{len(relevants)} relevant sets"
        )
    if not rankings:
        raise ValueError("rankings is empty: need at least one query")


def mean_reciprocal_rank(
    rankings: Sequence[Sequence[Hashable]], relevants: Sequence[Collection[Hashable]]
) -> float:
    """MRR: the mean over queries of :func:`reciprocal_rank` (Voorhees 1999, TREC-8 QA)."""
    _check_queries(rankings, relevants)
    return math.fsum(reciprocal_rank(r, s) for r, s in zip(rankings, relevants)) / len(rankings)


def ndcg_at_k(ranking: Sequence[Hashable], gains: Mapping[Hashable, Real], k: int) -> float:
    """nDCG@k (Järvelin & Kekäläinen 2002) with exponential gains (Burges et al. 2005).

    ``DCG@k = Σ_{i=1}^{k} (2^{g_i} - 1) / log2(i + 1)`` with ``g_i`` the gain of the item at
    rank ``i`` (0 when ``gains`` does not list it), divided by the DCG@k of the ideal order,
    ``gains`` sorted from highest to lowest.  0 when no gain is positive.
    """
    _check_ranking(ranking)
    _check_k(k)
    if not isinstance(gains, Mapping):
        raise TypeError(f"gains must be a mapping of id to gain, got {type(gains).__name__}")
    for item, gain in gains.items():
        if isinstance(gain, bool) or not isinstance(gain, Real) or not math.isfinite(gain):
            raise ValueError(f"gain of {item!r} must be a finite number, got {gain!r}")
        if gain < 0:
            raise ValueError(f"gain of {item!r} is negative ({gain}); gains must be >= 0")

    def dcg(values) -> float:
        return math.fsum((2.0**g - 1) / math.log2(i + 1) for i, g in enumerate(values, 1))

    ideal = dcg(sorted(gains.values(), reverse=True)[:k])
    if ideal == 0:
        return 0.0
    return dcg(gains.get(item, 0) for item in ranking[:k]) / ideal


def average_precision(ranking: Sequence[Hashable], relevant: Collection[Hashable]) -> float:
    """AP: ``Σ_{i : item i relevant} precision@i / |relevant|``, the mean over all relevant
    items of the precision at their rank, 0 for those not ranked.  ``relevant`` must not be
    empty."""
    _check_ranking(ranking)
    relevant = _relevant_set(relevant, required=True, metric="average precision")
    hits, total = 0, 0.0
    for rank, item in enumerate(ranking, 1):
        if item in relevant:
            hits += 1
            total += hits / rank
    return total / len(relevant)


def mean_average_precision(
    rankings: Sequence[Sequence[Hashable]], relevants: Sequence[Collection[Hashable]]
) -> float:
    """MAP: the mean over queries of :func:`average_precision`."""
    _check_queries(rankings, relevants)
    return math.fsum(average_precision(r, s) for r, s in zip(rankings, relevants)) / len(rankings)
