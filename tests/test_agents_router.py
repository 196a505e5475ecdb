"""The bandit router: its state is the closed-form ridge regression (numpy and scikit-learn as
references), LinUCB's scores and Thompson sampling's posterior match their formulas, regret on
a stationary linear workload grows sublinearly and stays far below a random router's, and the
host router learns which callable suits which request."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.linear_model import Ridge

from agentic_jax.agents.multi_agent import router as bandit
from agentic_jax.agents.multi_agent.router import Router

ARMS, DIM = 3, 4
update = jax.jit(bandit.update)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, ARMS - 1),
            st.lists(st.floats(-3, 3), min_size=DIM, max_size=DIM),
            st.floats(-2, 2),
        ),
        max_size=15,
    ),
    st.sampled_from([0.5, 1.0, 4.0]),
)
def test_the_state_is_the_closed_form_ridge_regression_of_each_arm(observations, ridge):
    state = bandit.init(ARMS, DIM, ridge)
    for arm, x, r in observations:
        state = update(state, arm, jnp.asarray(x), r)
    theta = np.asarray(bandit.estimates(state))
    for arm in range(ARMS):
        mine = [(np.array(x), r) for a, x, r in observations if a == arm]
        X = np.array([x for x, _ in mine]).reshape(-1, DIM)
        y = np.array([r for _, r in mine])
        A = ridge * np.eye(DIM) + X.T @ X
        b = X.T @ y
        np.testing.assert_allclose(state.A[arm], A, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(state.b[arm], b, rtol=1e-5, atol=1e-4)
        assert int(state.count[arm]) == len(mine)
        reference = (
            Ridge(alpha=ridge, fit_intercept=False, solver="cholesky").fit(X, y).coef_
            if mine
            else np.zeros(DIM)
        )
        np.testing.assert_allclose(theta[arm], reference, rtol=1e-3, atol=1e-3)


def trained_state(seed=0, steps=12):
    rng = np.random.default_rng(seed)
    state = bandit.init(ARMS, DIM, 1.0)
    for _ in range(steps):
        state = update(state, rng.integers(ARMS), jnp.asarray(rng.normal(size=DIM)), rng.normal())
    return state, rng.normal(size=DIM).astype(np.float32)


def test_linucb_scores_are_the_estimate_plus_the_confidence_width():
    state, x = trained_state()
    got = bandit.scores(state, x, jax.random.key(0), method="linucb", alpha=0.7)
    A, b = np.asarray(state.A, np.float64), np.asarray(state.b, np.float64)
    expected = [
        np.linalg.solve(A[a], b[a]) @ x + 0.7 * np.sqrt(x @ np.linalg.solve(A[a], x))
        for a in range(ARMS)
    ]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    assert int(bandit.select(state, x, jax.random.key(0), alpha=0.7)) == int(np.argmax(expected))


def test_thompson_samples_have_the_posterior_mean_and_variance():
    """Score samples θ̃ᵀx with θ̃ ~ N(θ̂, v²A⁻¹): mean θ̂ᵀx, variance v² xᵀA⁻¹x."""
    state, x = trained_state(1)
    keys = jax.random.split(jax.random.key(2), 20000)
    sampled = jax.vmap(lambda k: bandit.scores(state, x, k, method="thompson", noise=0.5))(keys)
    A, b = np.asarray(state.A, np.float64), np.asarray(state.b, np.float64)
    for a in range(ARMS):
        mean = np.linalg.solve(A[a], b[a]) @ x
        var = 0.25 * x @ np.linalg.solve(A[a], x)
        assert abs(float(sampled[:, a].mean()) - mean) < 4 * np.sqrt(var / len(keys))
        np.testing.assert_allclose(float(sampled[:, a].var()), var, rtol=0.05)


def linear_workload(seed, steps=1000, arms=4, dim=5):
    """A stationary workload: expected outcome x·θ_a, costs rising with the arm, noisy
    observed outcomes; the best arm depends on the request."""
    rng = np.random.default_rng(seed)
    theta = rng.normal(size=(arms, dim))
    X = np.concatenate([np.ones((steps, 1)), rng.normal(size=(steps, dim - 1))], axis=1)
    costs = np.linspace(0.0, 0.3, arms)
    observed = X @ theta.T + 0.1 * rng.normal(size=(steps, arms))
    expected = X @ theta.T - costs
    return X.astype(np.float32), observed.astype(np.float32), costs.astype(np.float32), expected


@pytest.mark.parametrize("method", ["linucb", "thompson"])
def test_regret_grows_sublinearly_and_far_below_a_random_routers(method):
    X, observed, costs, expected = linear_workload(seed=3)
    steps, arms = observed.shape
    state, chosen, rewards = bandit.replay(
        bandit.init(arms, X.shape[1]),
        jnp.asarray(X),
        jnp.asarray(observed),
        jnp.asarray(costs),
        jax.random.key(0),
        method=method,
        cost_weight=1.0,
    )
    np.testing.assert_allclose(rewards, observed - costs, rtol=1e-6)
    assert int(state.count.sum()) == steps
    # Against the best arm of every step: the second half adds less than the first.
    oracle = np.asarray(bandit.cumulative_regret(expected, chosen, per_step=True))
    half = steps // 2
    assert oracle[-1] - oracle[half - 1] < 0.25 * oracle[half - 1]
    # Against the best fixed arm, reported as asked, and a uniformly random router's.
    fixed = np.asarray(bandit.cumulative_regret(expected, chosen))
    uniform = np.random.default_rng(4).integers(0, arms, steps)
    random_fixed = np.asarray(bandit.cumulative_regret(expected, uniform))
    assert random_fixed[-1] / steps > 0.3
    assert fixed[-1] / steps < random_fixed[-1] / steps - 0.3


def test_cumulative_regret_against_a_hand_computed_example():
    rewards = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 3.0]])
    chosen = np.array([1, 0, 0])
    np.testing.assert_allclose(bandit.cumulative_regret(rewards, chosen), [1, 1, 2])
    np.testing.assert_allclose(bandit.cumulative_regret(rewards, chosen, per_step=True), [1, 1, 4])


@pytest.mark.parametrize("method", ["linucb", "thompson"])
def test_the_router_learns_the_cheapest_arm_that_handles_each_kind_of_request(method):
    """``calc`` does sums, ``chat`` talks, ``big`` does both at a cost: the router should send
    sums to calc and talk to chat once it has learnt."""
    kinds = {"sum": [1.0, 0.0], "talk": [0.0, 1.0]}
    handles = {"calc": {"sum"}, "chat": {"talk"}, "big": {"sum", "talk"}}
    cost = {"calc": 0.1, "chat": 0.1, "big": 1.0}
    arms = {name: (lambda kind, name=name: kind in handles[name]) for name in handles}
    router = Router(arms, kinds.__getitem__, dim=2, method=method, cost_weight=0.5, noise=0.2)
    late = []
    for step in range(160):
        kind = ("sum", "talk")[step % 2]
        routed = router.route(kind)
        router.feedback(routed, float(routed.result), cost[routed.arm])
        if step >= 120:
            late.append((kind, routed.arm))
    assert late == [("sum", "calc"), ("talk", "chat")] * 20
    assert len(router.rewards) == 160 and int(router.state.count.sum()) == 160


def test_bad_router_settings_are_rejected_by_name():
    with pytest.raises(ValueError, match="method must be one of"):
        Router({"a": str}, lambda r: [1.0], dim=1, method="greedy")
    with pytest.raises(ValueError, match="at least one arm"):
        Router({}, lambda r: [1.0], dim=1)
    with pytest.raises(ValueError, match="ridge must be positive"):
        bandit.init(2, 2, ridge=0.0)
    router = Router({"a": str}, lambda r: [1.0, 2.0], dim=3)
    with pytest.raises(ValueError, match=r"must have shape \(3,\), got \(2,\)"):
        router.route("x")
