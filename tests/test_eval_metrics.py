"""pass@k against the binomial closed form, bootstrap intervals against normal theory."""

from fractions import Fraction
from math import comb

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.eval import bootstrap_ci, hierarchical_bootstrap_ci, pass_at_k


@st.composite
def counts(draw):
    n = draw(st.integers(1, 60))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@settings(max_examples=25, deadline=None)
@given(st.lists(counts(), min_size=1, max_size=4))
def test_pass_at_k_is_one_minus_the_binomial_ratio(problems):
    # Chen et al. 2021, eq. 1, in exact arithmetic: 1 - C(n-c, k) / C(n, k).
    for n, c, k in problems:
        exact = 1 - Fraction(comb(n - c, k), comb(n, k))
        assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12)
    n, c, _ = map(np.array, zip(*problems))
    k = int(n.min())
    expected = [float(1 - Fraction(comb(a - b, k), comb(a, k))) for a, b in zip(n, c)]
    np.testing.assert_allclose(pass_at_k(n, c, k), expected, atol=1e-12)
    np.testing.assert_allclose(pass_at_k(n, c, 1), c / n, atol=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError, match="at least k=3"):
        pass_at_k([2, 10], [0, 1], 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_at_k(5, 1, 0)
    with pytest.raises(ValueError, match="must be integers"):
        pass_at_k(10, 2.5, 2)


def test_bootstrap_ci_matches_the_normal_interval_on_a_large_sample():
    values = np.random.default_rng(1).normal(0.3, 1.0, 400)
    half = scipy.stats.norm.ppf(0.975) * values.std(ddof=1) / np.sqrt(values.size)
    mean, low, high = bootstrap_ci(values)
    assert mean == pytest.approx(values.mean())
    assert (low, high) == pytest.approx((mean - half, mean + half), abs=0.01)
    # A constant difference has a zero-width interval (BCa is undefined there).
    assert bootstrap_ci(np.arange(10) + 1, paired_with=np.arange(10)) == (1.0, 1.0, 1.0)
    # Constant up to rounding: still a zero-width interval, not NaN.
    noisy = np.random.default_rng(2).uniform(0, 1000, 50)
    mean, low, high = bootstrap_ci(noisy + 0.1, paired_with=noisy)
    assert low == mean == high == pytest.approx(0.1)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci(values, confidence=95)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(60, 200), st.floats(0.1, 0.9))
def test_the_hierarchical_bootstrap_with_one_seed_is_the_percentile_bootstrap(seed, n, p):
    values = (np.random.default_rng(seed).random(n) < p).astype(float)
    if values.min() == values.max():
        return
    mean, low, high = hierarchical_bootstrap_ci(values[None], seed=seed, resamples=4000)
    reference = scipy.stats.bootstrap(
        (values,), np.mean, method="percentile", n_resamples=4000, random_state=seed
    ).confidence_interval
    assert mean == pytest.approx(values.mean())
    assert low == pytest.approx(reference.low, abs=0.03) and high == pytest.approx(
        reference.high, abs=0.03
    )


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 0.3))
def test_seed_to_seed_variance_widens_the_hierarchical_interval(seed, spread):
    """Rows that differ by a per-seed offset: the interval covers the row means' spread, and
    equal rows give the problem-level interval."""
    rng = np.random.default_rng(seed)
    problems = rng.random(80)
    offsets = np.array([-spread, 0.0, spread])
    _, low_same, high_same = hierarchical_bootstrap_ci(np.stack([problems] * 3), seed=seed)
    mean, low, high = hierarchical_bootstrap_ci(problems + offsets[:, None], seed=seed)
    assert low <= mean <= high
    # A tiny spread can narrow it by up to the spread itself (resampled offsets that cancel).
    assert high - low >= (high_same - low_same) - 2 * spread - 1e-9
    paired = hierarchical_bootstrap_ci(
        problems + offsets[:, None] + 0.25, paired_with=problems + offsets[:, None], seed=seed
    )
    assert paired == pytest.approx((0.25, 0.25, 0.25))


def test_the_hierarchical_bootstrap_names_bad_shapes():
    with pytest.raises(ValueError, match="seeds, problems"):
        hierarchical_bootstrap_ci(np.zeros(5))
    with pytest.raises(ValueError, match="one shape"):
        hierarchical_bootstrap_ci(np.zeros((2, 5)), paired_with=np.zeros((3, 5)))
