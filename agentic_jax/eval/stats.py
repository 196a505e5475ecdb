"""Statistics for comparing methods and judges: binomial intervals, paired tests, agreement.

A success rate on a few hundred problems is itself an estimate, so a benchmark table needs its
interval (Wilson's, which stays inside [0, 1] and keeps its coverage near 0 and 1 where the
normal interval does not).  Two methods run on the same problems are compared *paired*, by
problem, which removes the problem-to-problem variance that an unpaired test would count as
noise.  And scores from LLM judges or human raters are only as good as the raters agree, which
chance-corrected agreement coefficients (Cohen's and Fleiss' kappa, Krippendorff's alpha)
measure.  Everything here is numpy/scipy on the host: these are small arrays.
"""

from __future__ import annotations

import numpy as np
import scipy.stats


def wilson_interval(successes, n, confidence: float = 0.95) -> tuple[float, float]:
    """``(low, high)``, the Wilson score interval of a binomial proportion (Wilson 1927):

    ``(p̂ + z²/2n ± z √(p̂(1 - p̂)/n + z²/4n²)) / (1 + z²/n)`` with ``p̂ = successes / n`` and
    ``z`` the two-sided normal quantile of ``confidence``.
    """
    if not (isinstance(successes, int | np.integer) and isinstance(n, int | np.integer)):
        raise ValueError(f"successes and n must be integers, got {successes!r} and {n!r}")
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need n >= 1 and 0 <= successes <= n, got {successes} of {n}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = scipy.stats.norm.ppf((1 + confidence) / 2)
    p = successes / n
    denominator = 1 + z**2 / n
    center = (p + z**2 / (2 * n)) / denominator
    half = z * np.sqrt(p * (1 - p) / n + z**2 / (4 * n**2)) / denominator
    # Exact at the ends, where center ∓ half would leave a rounding residue.
    low = 0.0 if successes == 0 else float(center - half)
    high = 1.0 if successes == n else float(center + half)
    return low, high


def _paired(a, b, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``a`` and ``b`` as 1-D arrays of one length (scores of two methods on the same items)."""
    a, b = np.asarray(a, dtype), np.asarray(b, dtype)
    if a.ndim != 1 or a.shape != b.shape or a.size < 2:
        raise ValueError(
            f"need two 1-D arrays of one length >= 2 (paired by item), got {a.shape} and {b.shape}"
        )
    return a, b


def paired_permutation_test(a, b, *, resamples: int = 10000, seed: int = 0) -> float:
    """Two-sided p-value of the mean paired difference ``mean(a - b)`` under the null that the
    two methods are exchangeable on every item: each difference's sign is flipped at random
    (exactly enumerated when ``2**n <= resamples``; ``scipy.stats.permutation_test``).
    """
    a, b = _paired(a, b, np.float64)
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    result = scipy.stats.permutation_test(
        (a - b,),
        lambda d, axis: np.mean(d, axis=axis),
        permutation_type="samples",
        vectorized=True,
        n_resamples=resamples,
        alternative="two-sided",
        rng=np.random.default_rng(seed),
    )
    return float(result.pvalue)


def mcnemar_test(a_correct, b_correct) -> float:
    """Two-sided p-value of McNemar's exact test (McNemar 1947): on the items where exactly one
    method is correct, is each equally likely to be the one?  ``Binomial(b01 + b10, 1/2)`` at
    ``b01`` (``scipy.stats.binomtest``); 1 when no item is discordant.
    """
    a, b = _paired(a_correct, b_correct, None)
    if not all(x.dtype == bool or np.isin(x, (0, 1)).all() for x in (a, b)):
        raise ValueError("a_correct and b_correct must be booleans or 0/1 per item")
    a, b = a.astype(bool), b.astype(bool)
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    if only_a + only_b == 0:
        return 1.0
    return float(scipy.stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired_t_test(a, b) -> tuple[float, float]:
    """``(t, p)`` of the two-sided paired t-test of ``mean(a - b) = 0``
    (``scipy.stats.ttest_rel``); it assumes roughly normal differences, the permutation test
    does not.
    """
    a, b = _paired(a, b, np.float64)
    result = scipy.stats.ttest_rel(a, b)
    return float(result.statistic), float(result.pvalue)


def _disagreement_weights(n_labels: int, weights: str | None) -> np.ndarray:
    """``w[i, j]``, the penalty for rating categories ``i`` and ``j`` (ordered by index)."""
    distance = np.abs(np.subtract.outer(np.arange(n_labels), np.arange(n_labels)))
    if weights is None:
        return (distance > 0).astype(np.float64)
    if weights == "linear":
        return distance.astype(np.float64)
    if weights == "quadratic":
        return distance.astype(np.float64) ** 2
    raise ValueError(f"weights must be None, 'linear' or 'quadratic', got {weights!r}")


def cohen_kappa(a, b, *, weights: str | None = None, labels=None) -> float:
    """Cohen's kappa of two raters' labels of the same items (Cohen 1960), weighted (Cohen 1968)
    when ``weights`` is ``"linear"`` (``|i - j|``) or ``"quadratic"`` (``(i - j)²``):

    ``κ = 1 - Σ w_ij O_ij / Σ w_ij E_ij`` with ``O`` the confusion matrix and ``E`` its
    expectation under independent marginals.  ``labels`` fixes the categories and, for weighted
    kappa, their order (default: the sorted labels seen).  NaN when ``E`` has no disagreement
    (both raters always give one same label): agreement beyond chance is then undefined.
    """
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 1 or a.shape != b.shape or a.size == 0:
        raise ValueError(
            f"need two 1-D label arrays of one nonzero length, got {a.shape}, {b.shape}"
        )
    labels = np.unique(np.concatenate([a, b])) if labels is None else np.asarray(labels)
    index = {label: i for i, label in enumerate(labels.tolist())}
    if len(index) != labels.size:
        raise ValueError(f"labels must be distinct, got {labels.tolist()}")
    unknown = (set(a.tolist()) | set(b.tolist())) - set(index)
    if unknown:
        raise ValueError(f"labels {sorted(unknown, key=str)} are not in labels={labels.tolist()}")
    observed = np.zeros((labels.size, labels.size))
    np.add.at(observed, ([index[x] for x in a.tolist()], [index[x] for x in b.tolist()]), 1.0)
    expected = np.outer(observed.sum(1), observed.sum(0)) / a.size
    w = _disagreement_weights(labels.size, weights)
    chance = np.sum(w * expected)
    return float(1.0 - np.sum(w * observed) / chance) if chance > 0 else float("nan")


def fleiss_kappa(counts) -> float:
    """Fleiss' kappa (Fleiss 1971) of ``counts[items, categories]``, how many of the ``n``
    raters put each item in each category (every item rated by the same ``n >= 2``):

    ``κ = (P̄ - P_e) / (1 - P_e)``, ``P̄`` the mean over items of
    ``(Σ_j n_ij² - n) / (n(n - 1))`` (the agreeing rater pairs) and ``P_e = Σ_j p_j²`` with
    ``p_j`` category ``j``'s share of all ratings.  NaN when every rating is one category.
    """
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[0] < 1 or counts.shape[1] < 1:
        raise ValueError(f"need counts [items, categories], got shape {counts.shape}")
    if not np.issubdtype(counts.dtype, np.integer) or np.any(counts < 0):
        raise ValueError("counts must be non-negative integers (raters per item and category)")
    raters = counts.sum(1)
    if np.any(raters != raters[0]):
        raise ValueError(
            f"every item must be rated by the same number of raters, got {np.unique(raters)}"
        )
    n = int(raters[0])
    if n < 2:
        raise ValueError(f"need at least 2 raters per item, got {n}")
    counts = counts.astype(np.float64)
    agreement = ((counts**2).sum(1) - n) / (n * (n - 1))
    shares = counts.sum(0) / counts.sum()
    chance = float(np.sum(shares**2))
    if chance == 1.0:
        return float("nan")
    return float((agreement.mean() - chance) / (1 - chance))


def krippendorff_alpha(ratings, level: str = "nominal") -> float:
    """Krippendorff's alpha (Krippendorff 2011) of ``ratings[raters, items]``, NaN where a rater
    did not rate an item; any number of raters, missing values and ``level`` of measurement
    (``"nominal"``, ``"ordinal"``, ``"interval"`` or ``"ratio"``).

    ``α = 1 - D_o / D_e`` from the coincidence matrix ``o_ck = Σ_u (n_uc n_uk - [c = k] n_uc)
    / (m_u - 1)`` over the items ``u`` with ``m_u >= 2`` ratings (``n_uc`` of them value ``c``):
    ``D_o = Σ o_ck δ²_ck / n`` and ``D_e = Σ n_c n_k δ²_ck / (n(n - 1))`` with ``n_c = Σ_k o_ck``
    and ``n = Σ n_c``.  ``δ²`` is ``[c ≠ k]`` (nominal), ``(c - k)²`` (interval),
    ``((c - k)/(c + k))²`` (ratio) or ``(Σ_{g=c}^{k} n_g - (n_c + n_k)/2)²`` (ordinal, by rank).
    NaN when there is no expected disagreement (all pairable values equal).
    """
    ratings = np.asarray(ratings, np.float64)
    if ratings.ndim != 2:
        raise ValueError(f"need ratings [raters, items], got shape {ratings.shape}")
    if np.any(np.isinf(ratings)):
        raise ValueError("ratings must be finite or NaN (missing)")
    if level not in ("nominal", "ordinal", "interval", "ratio"):
        raise ValueError(
            f"level must be 'nominal', 'ordinal', 'interval' or 'ratio', got {level!r}"
        )
    present = ~np.isnan(ratings)
    values = np.unique(ratings[present])
    if level == "ratio" and np.any(values < 0):
        raise ValueError("ratio-level ratings must be non-negative")
    # per_item[u, c]: how many raters gave item u the value c.
    per_item = np.zeros((ratings.shape[1], values.size))
    raters, items = np.nonzero(present)
    np.add.at(per_item, (items, np.searchsorted(values, ratings[raters, items])), 1.0)
    per_item = per_item[per_item.sum(1) >= 2]
    if per_item.size == 0:
        raise ValueError("no item has at least 2 ratings, so there are no pairs to compare")
    scaled = per_item / (per_item.sum(1, keepdims=True) - 1)
    coincidence = scaled.T @ per_item - np.diag(scaled.sum(0))
    marginals = coincidence.sum(1)
    total = marginals.sum()
    if level == "nominal":
        delta = 1.0 - np.eye(values.size)
    elif level == "interval":
        delta = np.subtract.outer(values, values) ** 2
    elif level == "ratio":
        sums = np.add.outer(values, values)
        differences = np.subtract.outer(values, values)
        delta = (np.divide(differences, sums, out=np.zeros_like(sums), where=sums > 0)) ** 2
    else:
        # Σ_{g=c}^{k} n_g over the values ranked between c and k, both included.
        index = np.arange(values.size)
        low, high = np.minimum.outer(index, index), np.maximum.outer(index, index)
        cumulative = np.cumsum(marginals)
        between = cumulative[high] - cumulative[low] + marginals[low]
        delta = (between - np.add.outer(marginals, marginals) / 2) ** 2
    expected = np.sum(np.outer(marginals, marginals) * delta) / (total - 1)
    if expected == 0:
        return float("nan")
    return float(1.0 - np.sum(coincidence * delta) / expected)
