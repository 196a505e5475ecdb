"""Intervals, paired tests and agreement coefficients against scipy, scikit-learn, the
krippendorff package, slow loop references and textbook worked examples."""

import itertools
import warnings

import krippendorff
import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import cohen_kappa_score

from agentic_jax.eval.stats import (
    cohen_kappa,
    fleiss_kappa,
    krippendorff_alpha,
    mcnemar_test,
    paired_permutation_test,
    paired_t_test,
    wilson_interval,
)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 500).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
    st.sampled_from([0.5, 0.9, 0.95, 0.99]),
)
def test_wilson_interval_matches_scipy(counts, confidence):
    k, n = counts
    reference = scipy.stats.binomtest(k, n).proportion_ci(confidence, method="wilson")
    low, high = wilson_interval(k, n, confidence)
    assert low == pytest.approx(reference.low, abs=1e-12)
    assert high == pytest.approx(reference.high, abs=1e-12)
    assert 0 <= low <= k / n <= high <= 1


def test_wilson_interval_rejects_bad_counts():
    with pytest.raises(ValueError, match="0 <= successes <= n"):
        wilson_interval(6, 5)
    with pytest.raises(ValueError, match="integers"):
        wilson_interval(2.5, 5)
    with pytest.raises(ValueError, match="confidence"):
        wilson_interval(2, 5, confidence=1.0)


def test_permutation_test_is_one_for_identical_methods_and_small_for_a_shift():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=60)
    assert paired_permutation_test(scores, scores) == 1.0
    shifted = scores + 0.5 + rng.normal(0, 0.1, 60)
    assert paired_permutation_test(shifted, scores, resamples=2000) < 0.01
    noise = scores + rng.normal(0, 0.1, 60)
    assert paired_permutation_test(noise, scores, resamples=2000) > 0.05


def test_permutation_test_enumerates_small_samples_exactly():
    differences = np.array([0.3, -0.1, 0.8, 0.4, -0.2, 0.6, 0.1])
    observed = abs(differences.mean())
    flips = np.array(list(itertools.product([-1, 1], repeat=differences.size)))
    exact = np.mean(np.abs((flips * differences).mean(1)) >= observed - 1e-12)
    assert paired_permutation_test(differences, np.zeros(7)) == pytest.approx(exact)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=80))
def test_mcnemar_is_the_exact_binomial_on_discordant_pairs(pairs):
    a, b = map(np.array, zip(*pairs))
    only_a, only_b = int(np.sum(a & ~b)), int(np.sum(~a & b))
    p = mcnemar_test(a, b)
    if only_a + only_b == 0:
        assert p == 1.0
        return
    assert p == pytest.approx(scipy.stats.binomtest(only_a, only_a + only_b).pvalue)
    # The closed form: twice the smaller binomial tail at 1/2, capped at 1.
    m = only_a + only_b
    tail = scipy.stats.binom.cdf(min(only_a, only_b), m, 0.5)
    assert p == pytest.approx(min(1.0, 2 * tail))
    assert mcnemar_test(a.astype(int), b.astype(int)) == p


def test_mcnemar_rejects_non_binary_scores():
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_test([0, 1, 2], [1, 1, 0])
    with pytest.raises(ValueError, match="paired by item"):
        mcnemar_test([0, 1, 1], [1, 1])


def test_paired_t_test_wraps_scipy():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=30), rng.normal(size=30)
    reference = scipy.stats.ttest_rel(a, b)
    assert paired_t_test(a, b) == pytest.approx((reference.statistic, reference.pvalue))


@st.composite
def label_pairs(draw):
    n_labels = draw(st.integers(2, 5))
    size = draw(st.integers(2, 60))
    a = draw(st.lists(st.integers(0, n_labels - 1), min_size=size, max_size=size))
    agree = draw(st.lists(st.booleans(), min_size=size, max_size=size))
    other = draw(st.lists(st.integers(0, n_labels - 1), min_size=size, max_size=size))
    return np.array(a), np.where(agree, a, other)


@settings(max_examples=40, deadline=None)
@given(label_pairs(), st.sampled_from([None, "linear", "quadratic"]))
def test_cohen_kappa_matches_sklearn(pair, weights):
    a, b = pair
    labels = np.arange(6)[::-1]  # an unseen category and a reversed order
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns where kappa is undefined (NaN)
        expected = cohen_kappa_score(a, b, weights=weights)
        reordered = cohen_kappa_score(a, b, weights=weights, labels=labels)
    for reference, got in [
        (expected, cohen_kappa(a, b, weights=weights)),
        (reordered, cohen_kappa(a, b, weights=weights, labels=labels)),
    ]:
        if np.isnan(reference):
            assert np.isnan(got)
        else:
            assert got == pytest.approx(reference, abs=1e-12)


def test_cohen_kappa_takes_string_labels_and_rejects_unknown_ones():
    a, b = ["yes", "no", "yes", "yes"], ["yes", "no", "no", "yes"]
    assert cohen_kappa(a, b) == pytest.approx(cohen_kappa_score(a, b))
    with pytest.raises(ValueError, match="not in labels"):
        cohen_kappa(a, b, labels=["yes"])
    with pytest.raises(ValueError, match="weights must be"):
        cohen_kappa(a, b, weights="cubic")


# Fleiss 1971 via Wikipedia's worked example: 10 items, 14 raters, 5 categories; κ = 0.210.
WIKIPEDIA_FLEISS = [
    [0, 0, 0, 0, 14],
    [0, 2, 6, 4, 2],
    [0, 0, 3, 5, 6],
    [0, 3, 9, 2, 0],
    [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0],
    [3, 2, 6, 3, 0],
    [2, 5, 3, 2, 2],
    [6, 5, 2, 1, 0],
    [0, 2, 2, 3, 7],
]


def fleiss_reference(counts) -> float:
    """Fleiss' kappa by loops over items and categories, as the paper writes it."""
    items, categories = len(counts), len(counts[0])
    n = sum(counts[0])
    p_bar = 0.0
    for row in counts:
        p_bar += sum(x * (x - 1) for x in row) / (n * (n - 1)) / items
    p_e = sum((sum(row[j] for row in counts) / (items * n)) ** 2 for j in range(categories))
    return (p_bar - p_e) / (1 - p_e)


def test_fleiss_kappa_matches_the_worked_example():
    assert fleiss_kappa(WIKIPEDIA_FLEISS) == pytest.approx(0.20993, abs=5e-6)
    assert round(fleiss_kappa(WIKIPEDIA_FLEISS), 3) == 0.210


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 8), st.integers(2, 5), st.integers(1, 20), st.integers(0, 2**32 - 1))
def test_fleiss_kappa_matches_a_loop_reference(raters, categories, items, seed):
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(raters, rng.dirichlet(np.ones(categories)), size=items)
    got, shares = fleiss_kappa(counts), counts.sum(0) / counts.sum()
    if np.max(shares) == 1.0:
        assert np.isnan(got)
    else:
        assert got == pytest.approx(fleiss_reference(counts.tolist()), abs=1e-12)


def test_fleiss_kappa_rejects_unequal_raters():
    with pytest.raises(ValueError, match="same number of raters"):
        fleiss_kappa([[1, 2], [2, 2]])
    with pytest.raises(ValueError, match="at least 2 raters"):
        fleiss_kappa([[1, 0], [0, 1]])
    with pytest.raises(ValueError, match="non-negative integers"):
        fleiss_kappa([[1.5, 0.5]])


@settings(max_examples=40, deadline=None)
@given(
    st.integers(2, 5),
    st.integers(2, 25),
    st.integers(2, 6),
    st.floats(0.0, 0.5),
    st.sampled_from(["nominal", "ordinal", "interval", "ratio"]),
    st.integers(0, 2**32 - 1),
)
def test_krippendorff_alpha_matches_the_package(raters, items, values, missing, level, seed):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, values, items)
    ratings = np.where(rng.random((raters, items)) < 0.6, truth, rng.integers(0, values, items))
    ratings = (ratings * 1.5 + 1.0).astype(np.float64)  # non-consecutive, positive values
    ratings[rng.random(ratings.shape) < missing] = np.nan
    pairable = ratings[:, (~np.isnan(ratings)).sum(0) >= 2]
    if pairable.size == 0:
        with pytest.raises(ValueError, match="at least 2 ratings"):
            krippendorff_alpha(ratings, level)
        return
    if np.unique(pairable[~np.isnan(pairable)]).size < 2:
        assert np.isnan(krippendorff_alpha(ratings, level))
        return
    expected = krippendorff.alpha(reliability_data=ratings, level_of_measurement=level)
    assert krippendorff_alpha(ratings, level) == pytest.approx(expected, abs=1e-9)


def test_krippendorff_alpha_is_one_for_perfect_agreement_and_checks_its_input():
    ratings = np.array([[1.0, 2.0, 3.0, np.nan], [1.0, 2.0, 3.0, 4.0]])
    for level in ("nominal", "ordinal", "interval", "ratio"):
        assert krippendorff_alpha(ratings, level) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="level must be"):
        krippendorff_alpha(ratings, "cardinal")
    with pytest.raises(ValueError, match=r"\[raters, items\]"):
        krippendorff_alpha(ratings[0])
    with pytest.raises(ValueError, match="non-negative"):
        krippendorff_alpha(-ratings, "ratio")
