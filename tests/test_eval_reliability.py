"""pass^k against the exact binomial ratio, and its order relations with pass@k."""

from fractions import Fraction
from math import comb

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.eval.metrics import pass_at_k, pass_hat_k


@st.composite
def counts(draw):
    n = draw(st.integers(1, 80))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


@settings(max_examples=40, deadline=None)
@given(st.lists(counts(), min_size=1, max_size=4))
def test_pass_hat_k_is_the_binomial_ratio(problems):
    # Yao et al. 2024: pass^k = C(c, k) / C(n, k), in exact arithmetic.
    for n, c, k in problems:
        exact = Fraction(comb(c, k), comb(n, k))
        assert pass_hat_k(n, c, k) == pytest.approx(float(exact), rel=1e-12, abs=1e-300)
    n, c, _ = map(np.array, zip(*problems))
    k = int(n.min())
    expected = [float(Fraction(comb(b, k), comb(a, k))) for a, b in zip(n, c)]
    np.testing.assert_allclose(pass_hat_k(n, c, k), expected, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(counts())
def test_pass_hat_k_is_below_pass_at_k_and_falls_with_k(problem):
    n, c, _ = problem
    assert pass_hat_k(n, c, 1) == pytest.approx(c / n, abs=1e-12)
    assert pass_hat_k(n, c, 1) == pytest.approx(pass_at_k(n, c, 1), abs=1e-12)
    hat = np.array([pass_hat_k(n, c, k) for k in range(1, n + 1)])
    at = np.array([pass_at_k(n, c, k) for k in range(1, n + 1)])
    assert np.all(hat <= at + 1e-12)
    assert np.all(np.diff(hat) <= 1e-15)


def test_pass_hat_k_broadcasts_and_has_exact_corners():
    out = pass_hat_k(np.array([[10], [20]]), np.array([0, 5, 10]), 3)
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(out[:, 0], 0.0)  # no successes
    assert out[0, 2] == 1.0  # every trial succeeded
    assert pass_hat_k(10, 2, 3) == 0.0  # fewer successes than draws
    assert pass_hat_k(1000, 999, 500) == pytest.approx(0.5, abs=1e-12)  # (n - k) / n


def test_pass_hat_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_hat_k(5, 6, 1)
    with pytest.raises(ValueError, match="at least k=3"):
        pass_hat_k([2, 10], [0, 1], 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        pass_hat_k(5, 1, 0)
    with pytest.raises(ValueError, match="must be integers"):
        pass_hat_k(10, 2.5, 2)
