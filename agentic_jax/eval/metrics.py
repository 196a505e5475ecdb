"""Metrics of sampled solutions: pass@k, pass^k and bootstrap confidence intervals."""

from __future__ import annotations

import numpy as np
import scipy.stats


def _counts(n, c, k: int, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """``n`` and ``c`` broadcast together, after checking they are counts that ``metric`` at
    ``k`` can use."""
    n, c = np.asarray(n), np.asarray(c)
    if not all(np.issubdtype(a.dtype, np.integer) for a in (n, c, np.asarray(k))):
        raise ValueError(
            f"n, c and k must be integers (counts of samples); got {n.dtype}, "
            f"{c.dtype} and {np.asarray(k).dtype}"
        )
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("need 0 <= c <= n for every problem")
    if np.any(n < k):
        raise ValueError(f"{metric}{k} needs at least k={k} samples per problem; got n={n.min()}")
    return np.broadcast_arrays(n, c)


def pass_at_k(n, c, k: int):
    """The unbiased pass@k estimator ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, arXiv:2107.03374).

    ``n`` samples of a problem of which ``c`` are correct; arrays broadcast.  Computed as
    ``1 - Π_{i=n-c+1}^{n} (1 - k/i)``, which never forms the huge binomials.
    """
    n_b, c_b = _counts(n, c, k, "pass@")
    out = np.empty(n_b.shape, np.float64)
    for index in np.ndindex(n_b.shape):
        total, correct = int(n_b[index]), int(c_b[index])
        i = np.arange(total - correct + 1, total + 1, dtype=np.float64)
        out[index] = 1.0 if total - correct < k else 1.0 - np.prod(1.0 - k / i)
    return out if out.ndim else float(out)


def pass_hat_k(n, c, k: int):
    """pass^k, the chance that ``k`` trials drawn without replacement from ``n`` all succeed:
    ``C(c, k) / C(n, k)`` (Yao et al. 2024, τ-bench, arXiv:2406.12045).

    Where pass@k rewards one success in k tries, pass^k asks for k out of k, so it measures how
    reliably a task is solved.  ``n`` trials of a problem of which ``c`` succeeded; arrays
    broadcast.  Computed as ``Π_{i=0}^{k-1} (c - i) / (n - i)``, never the huge binomials.
    """
    n_b, c_b = _counts(n, c, k, "pass^")
    i = np.arange(k, dtype=np.float64)
    # A factor (c - i) / (n - i) is 0 once i reaches c, so c < k gives exactly 0.
    ratios = np.maximum(c_b[..., None] - i, 0.0) / (n_b[..., None] - i)
    out = np.prod(ratios, axis=-1)
    return out if out.ndim else float(out)


def _differences(values, paired_with) -> np.ndarray:
    """``values`` as float64, minus ``paired_with`` (same shape) when given."""
    values = np.asarray(values, np.float64)
    if paired_with is None:
        return values
    other = np.asarray(paired_with, np.float64)
    if other.shape != values.shape:
        raise ValueError(f"paired values must have one shape, got {values.shape} and {other.shape}")
    return values - other


def bootstrap_ci(
    values, *, paired_with=None, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)``: the mean of ``values`` (per problem, e.g. 0/1 success) and its
    bootstrap confidence interval (BCa, ``scipy.stats.bootstrap``).

    With ``paired_with`` (the same problems under another method) it is the mean *difference*
    ``values - paired_with`` resampled by problem, the comparison whose interval excluding 0
    means one method beats the other on this task distribution.
    """
    values = _differences(values, paired_with)
    if values.ndim != 1 or values.size < 2:
        raise ValueError(f"need a 1-D array of at least 2 values, got shape {values.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    mean = float(values.mean())
    # Constant up to rounding (paired differences such as (v + 1) - v): BCa is undefined there
    # and scipy would return NaN.
    if np.allclose(values, values[0], rtol=1e-9, atol=1e-12):
        return mean, mean, mean
    result = scipy.stats.bootstrap(
        (values,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="BCa",
        random_state=np.random.default_rng(seed),
    )
    return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)


def hierarchical_bootstrap_ci(
    values, *, paired_with=None, confidence: float = 0.95, resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(mean, low, high)`` of ``values`` ``[seeds, problems]`` (one row per training seed, e.g.
    0/1 success on the same held-out problems) with a two-level percentile bootstrap: each
    resample draws seeds with replacement, then problems with replacement (one draw shared by
    the seeds, since they solve the same problems), so the interval holds both the run-to-run
    variance of training and the sampling of problems.  With one seed it is the percentile
    bootstrap over problems.  ``paired_with`` (same shape) gives the interval of the mean
    difference, resampled jointly.
    """
    values = _differences(values, paired_with)
    if values.ndim != 2 or values.shape[1] < 2:
        raise ValueError(f"need [seeds, problems] with at least 2 problems, got {values.shape}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    n_seeds, n_problems = values.shape
    seeds = rng.integers(0, n_seeds, (resamples, n_seeds))
    problems = rng.integers(0, n_problems, (resamples, n_problems))
    means = values[seeds[:, :, None], problems[:, None, :]].mean(axis=(1, 2))
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(values.mean()), float(low), float(high)
