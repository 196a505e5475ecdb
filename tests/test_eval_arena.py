"""Arena ratings against simulated tournaments of known strengths, a scipy maximum-likelihood
reference, Elo's hand formula and plain-Python win counts."""

import math

import numpy as np
import pytest
import scipy.optimize
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.eval import arena
from agentic_jax.eval.arena import Battles

ELO = 400 / math.log(10)  # Elo points per unit of natural log-strength


def tournament(strengths, n_battles, seed, tie_rate=0.0):
    """Random pairs of distinct models; a beats b with probability σ(θ_a − θ_b), and a
    fraction ``tie_rate`` of battles are ties whatever the strengths (which pulls the fitted
    ratings together, so the recovery tests have none)."""
    rng = np.random.default_rng(seed)
    strengths = np.asarray(strengths, np.float64)
    m = strengths.size
    a = rng.integers(0, m, n_battles)
    b = (a + rng.integers(1, m, n_battles)) % m
    p = 1 / (1 + np.exp(strengths[b] - strengths[a]))
    outcome = (rng.uniform(size=n_battles) < p).astype(np.float64)
    outcome[rng.uniform(size=n_battles) < tie_rate] = 0.5
    return Battles(a, b, outcome)


def true_ratings(strengths):
    strengths = np.asarray(strengths, np.float64)
    return 1000 + ELO * (strengths - strengths.mean())


def test_bradley_terry_recovers_the_strengths_of_a_simulated_tournament():
    strengths = np.linspace(-2, 2, 6)
    battles = tournament(strengths, 3000, seed=0)
    ratings, style = arena.bt_ratings(battles, 6)
    assert list(np.argsort(ratings)) == list(range(6))
    assert ratings.mean() == pytest.approx(1000)
    np.testing.assert_allclose(ratings, true_ratings(strengths), atol=40)  # ~3 standard errors
    assert style.shape == (0,)
    # The battle-level regression is the aggregated wins' Bradley-Terry on the Elo scale, a tie
    # counting as half a win each way.
    battles = tournament(strengths, 3000, seed=1, tie_rate=0.2)
    ratings = arena.bt_ratings(battles, 6).ratings
    wins = np.zeros((6, 6))
    np.add.at(wins, (battles.model_a, battles.model_b), battles.outcome)
    np.add.at(wins, (battles.model_b, battles.model_a), 1 - battles.outcome)
    np.testing.assert_allclose(ratings, 1000 + ELO * arena.bradley_terry(wins), atol=1e-2)


def test_bootstrap_intervals_cover_the_true_ratings():
    strengths = np.array([-1.0, -0.4, 0.0, 0.3, 1.1])
    truth = true_ratings(strengths)
    covered = []
    for seed in range(8):
        battles = tournament(strengths, 800, seed=seed)
        mean, low, high = arena.bootstrap_ratings(battles, 5, resamples=200, seed=seed)
        assert np.all(low < mean) and np.all(mean < high)
        covered.extend((low <= truth) & (truth <= high))
    assert np.mean(covered) >= 0.8, np.mean(covered)
    # Same seed, same intervals; wider confidence, wider intervals.
    battles = tournament(strengths, 800, seed=0)
    again = arena.bootstrap_ratings(battles, 5, resamples=200, seed=0)
    np.testing.assert_array_equal(again.low, arena.bootstrap_ratings(battles, 5, resamples=200).low)
    narrow = arena.bootstrap_ratings(battles, 5, resamples=200, confidence=0.5)
    assert np.all(narrow.high - narrow.low < again.high - again.low)


def reference_bradley_terry(wins):
    """Maximum likelihood in float64 numpy and scipy: θ_0 = 0 fixed, then centred."""

    def nll(free):
        theta = np.concatenate([[0.0], free])
        gap = theta[:, None] - theta[None, :]
        loss = np.sum(wins * np.logaddexp(0, -gap))
        push = wins / (1 + np.exp(gap))  # wins · σ(−gap)
        grad = push.T.sum(axis=1) - push.sum(axis=1)
        return loss, grad[1:]

    m = wins.shape[0]
    free = scipy.optimize.minimize(nll, np.zeros(m - 1), jac=True, method="BFGS", tol=1e-12).x
    theta = np.concatenate([[0.0], free])
    return theta - theta.mean()


@settings(max_examples=12, deadline=None)
@given(
    st.integers(3, 5).flatmap(
        lambda m: st.lists(st.integers(1, 25), min_size=m * m, max_size=m * m)
    )
)
def test_bradley_terry_equals_a_scipy_maximum_likelihood(counts):
    m = math.isqrt(len(counts))
    wins = np.array(counts, np.float64).reshape(m, m)
    wins[0, 1] += 0.5  # a tie counted as half a win each way
    wins[1, 0] += 0.5
    np.fill_diagonal(wins, 0)
    theta = arena.bradley_terry(wins)
    assert theta.mean() == pytest.approx(0, abs=1e-6)
    np.testing.assert_allclose(theta, reference_bradley_terry(wins), atol=1e-4)


def test_bradley_terry_stays_finite_for_an_unbeaten_model():
    wins = np.array([[0, 5, 5], [0, 0, 3], [0, 2, 0]], np.float64)
    theta = arena.bradley_terry(wins)
    assert np.all(np.isfinite(theta)) and theta[0] > theta[1] + 5
    np.testing.assert_allclose(theta[1] - theta[2], math.log(3 / 2), atol=1e-3)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(0, 10**6),
    st.floats(-5000, 5000, allow_nan=False),
    st.lists(st.floats(800, 1400), min_size=4, max_size=4),
)
def test_elo_is_invariant_to_a_constant_added_to_the_initial_ratings(seed, shift, start):
    battles = tournament([0.0, 0.5, 1.0, -0.5], 60, seed=seed, tie_rate=0.2)
    base = arena.elo(battles, 4, init=np.array(start))
    shifted = arena.elo(battles, 4, init=np.array(start) + shift)
    np.testing.assert_allclose(shifted - shift, base, rtol=0, atol=1e-8)
    assert base.sum() == pytest.approx(sum(start), abs=1e-3)  # every battle is zero-sum


def test_elo_of_one_battle_is_the_hand_formula():
    for outcome in (1.0, 0.5, 0.0):
        one = arena.elo(Battles([0], [1], [outcome]), 2, k=32, init=[1000, 1200])
        expected = 1 / (1 + 10 ** ((1200 - 1000) / 400))
        change = 32 * (outcome - expected)
        np.testing.assert_allclose(one, [1000 + change, 1200 - change], atol=1e-3)
    # Defaults: k=4 from a common start of 1000; the winner gains k/2.
    np.testing.assert_allclose(arena.elo(Battles([1], [0], [1.0]), 2), [998, 1002], atol=1e-4)


def test_style_control_separates_a_length_preference_from_strength():
    rng = np.random.default_rng(1)
    n, longest = 3000, np.array([600, 300, 300])  # model 0 writes twice as much on average
    a = rng.integers(0, 3, n)
    b = (a + rng.integers(1, 3, n)) % 3
    text_a = ["word " * k for k in rng.integers(20, longest[a])]
    text_b = ["word " * k for k in rng.integers(20, longest[b])]
    style = arena.style_features(text_a, text_b)
    # Equal models; the judge prefers the longer answer: logit 3 · (normalised length gap).
    outcome = (rng.uniform(size=n) < 1 / (1 + np.exp(-3 * style[:, 0]))).astype(np.float64)
    battles = Battles(a, b, outcome, covariates=style)
    plain, _ = arena.bt_ratings(battles, 3)
    controlled, coefficients = arena.bt_ratings(battles, 3, style=True)
    # Coefficients are per standard deviation of the feature; no markdown, no coefficient.
    assert coefficients[0] == pytest.approx(3 * style[:, 0].std(), rel=0.15)
    assert np.all(coefficients[1:] == 0)
    assert plain[0] > plain[1] + 50  # the verbose model gains without style control
    assert np.ptp(controlled) < np.ptp(plain) / 3 and np.ptp(controlled) < 40
    np.testing.assert_allclose(arena.bt_ratings(battles, 3, style=style).ratings, controlled)


def test_style_features_count_length_and_markdown():
    rich = "# Title\n\n- one\n- two\n1. three\n\n**bold** and __also__\n```\n# not a header\n```"
    plain = "just a few words"
    features = arena.style_features(rich, plain)
    counts = np.array([len(rich.split()), 1, 3, 2]), np.array([4, 0, 0, 0])
    np.testing.assert_allclose(features, (counts[0] - counts[1]) / (counts[0] + counts[1]))
    np.testing.assert_allclose(arena.style_features([plain, rich], [rich, rich])[0], -features)
    assert arena.style_features("", "").tolist() == [0, 0, 0, 0]


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 3), st.sampled_from([0.0, 0.5, 1.0])),
        min_size=1,
        max_size=30,
    )
)
def test_win_rate_matrix_matches_a_python_loop(games):
    a = [x for x, _, _ in games]
    b = [(x + step) % 4 for x, step, _ in games]
    outcome = [s for _, _, s in games]
    rates = arena.win_rate_matrix(Battles(a, b, outcome), 4)
    for i in range(4):
        for j in range(4):
            score = [
                s if (x, y) == (i, j) else 1 - s
                for x, y, s in zip(a, b, outcome)
                if {x, y} == {i, j}
            ]
            if i == j or not score:
                assert np.isnan(rates[i, j])
            else:
                assert rates[i, j] == pytest.approx(sum(score) / len(score))


def test_predicted_win_rate_is_the_logistic_of_the_rating_gap():
    rates = arena.predicted_win_rate([1000, 1200, 800])
    assert rates[1, 0] == pytest.approx(1 / (1 + 10 ** (-200 / 400)))
    np.testing.assert_allclose(rates + rates.T, 1)
    np.testing.assert_allclose(np.diag(rates), 0.5)


def test_leaderboard_and_plots(tmp_path):
    names = ["x", "y", "z", "w"]
    ratings, low, high = [900, 1100, 1000, 1090], [850, 1060, 950, 1040], [950, 1150, 1050, 1120]
    table = arena.leaderboard(names, ratings, low, high, [30, 31, 32, 33]).splitlines()
    assert table[0] == "| Rank | Model | Rating | CI | Battles |"
    # Rank = 1 + the models whose interval lies wholly above: y and w overlap (both 1), only
    # y is surely above z (2), y and w are surely above x (3).
    assert [row.split(" | ")[:2] for row in table[2:]] == [
        ["| 1", "y"],
        ["| 1", "w"],
        ["| 2", "z"],
        ["| 3", "x"],
    ]
    assert table[2] == "| 1 | y | 1100 | +50 / -40 | 31 |"
    assert (
        arena.leaderboard(names, ratings, None, None, [1, 1, 1, 1]).splitlines()[3][:5] == "| 2 |"
    )
    battles = tournament([0.0, 0.5, 1.0, -0.5], 50, seed=0, tie_rate=0.2)
    arena.plot_ratings(names, ratings, low, high, tmp_path / "ratings.png")
    arena.plot_win_rates(names, arena.win_rate_matrix(battles, 4), tmp_path / "wins.png")
    for name in ("ratings.png", "wins.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validation_errors_name_the_problem():
    with pytest.raises(ValueError, match=r"model_b indices must be in \[0, 3\)"):
        arena.bt_ratings(Battles([0], [3], [1.0]), 3)
    with pytest.raises(ValueError, match=r"model_a indices"):
        arena.elo(Battles([-1], [1], [1.0]), 3)
    with pytest.raises(ValueError, match=r"outcome must lie in \[0, 1\]"):
        Battles([0], [1], [2.0])
    with pytest.raises(ValueError, match="one length"):
        Battles([0, 1], [1], [1.0])
    with pytest.raises(ValueError, match="two different models"):
        Battles([1], [1], [1.0])
    with pytest.raises(ValueError, match="integer model indices"):
        Battles([0.5], [1], [1.0])
    with pytest.raises(ValueError, match="covariates must be"):
        Battles([0], [1], [1.0], covariates=[1.0])
    with pytest.raises(ValueError, match=r"style=True needs battles\.covariates"):
        arena.bt_ratings(Battles([0], [1], [1.0]), 2, style=True)
    with pytest.raises(ValueError, match="square"):
        arena.bradley_terry(np.ones((2, 3)))
    with pytest.raises(ValueError, match="non-negative"):
        arena.bradley_terry(-np.ones((2, 2)))
    with pytest.raises(ValueError, match="confidence"):
        arena.bootstrap_ratings(Battles([0], [1], [1.0]), 2, confidence=95)
    with pytest.raises(ValueError, match="one value per model"):
        arena.leaderboard(["x"], [1, 2], None, None, [1, 1])
