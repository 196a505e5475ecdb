"""Agent-as-a-Router: a contextual bandit picks the model, agent or tool chain for each request.

Each arm ``a`` keeps a ridge regression of reward on the request's feature vector ``x`` (the
disjoint linear model of Li et al. 2010, *A Contextual-Bandit Approach to Personalized News
Article Recommendation*, WWW), over the requests it served::

    A_a = λ I + Σ x xᵀ        b_a = Σ r x        θ̂_a = A_a⁻¹ b_a

and the router picks

* by **LinUCB** (Li et al. 2010, Algorithm 1): ``argmax_a θ̂_aᵀx + α √(xᵀ A_a⁻¹ x)``, the
  estimate plus a confidence width that shrinks as the arm sees requests like this one;
* by **linear Thompson sampling** (Agrawal & Goyal 2013, *Thompson Sampling for Contextual
  Bandits with Linear Payoffs*, ICML): ``θ̃_a ~ N(θ̂_a, v² A_a⁻¹)``, ``argmax_a θ̃_aᵀx``, with
  one posterior per arm (the disjoint form of their shared-parameter algorithm).

The reward trades outcome against cost: ``r = outcome − λ_cost · cost`` (:func:`reward`; cost
in any unit the caller measures: dollars, tokens, seconds), so a cheap arm wins where it is
good enough.

The numeric core is pure jnp over a :class:`RouterState` pytree: :func:`init`, :func:`select`
and :func:`update` are jit-able, and :func:`replay` runs a whole workload whose every arm's
outcome is known in one ``lax.scan`` (simulations and benchmarks).  :class:`Router` is the host
side: it turns a request into features, calls the chosen arm (any callable: a policy's
``respond``, a team's ``run``, a client of the serving API) and learns from the outcome and cost
the caller reports.

**Regret.**  :func:`cumulative_regret` is ``R(t) = max_a Σ_{s≤t} r_{s,a} − Σ_{s≤t} r_{s,a_s}``,
against the best fixed arm in hindsight; with ``per_step=True`` it is against the best arm of
every step instead (the best context-dependent choice), the harder comparator a contextual
router can approach and a fixed arm cannot.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

METHODS = ("linucb", "thompson")


class RouterState(NamedTuple):
    A: jax.Array  # (arms, d, d): λI + Σ x xᵀ of each arm
    b: jax.Array  # (arms, d): Σ r x of each arm
    count: jax.Array  # (arms,): requests each arm served


def init(num_arms: int, dim: int, ridge: float = 1.0) -> RouterState:
    """No requests seen: ``A_a = λI``, ``b_a = 0`` (``ridge`` is λ, the prior precision)."""
    if num_arms < 1 or dim < 1:
        raise ValueError(f"a router needs at least one arm and one feature, got {num_arms}, {dim}")
    if not ridge > 0:
        raise ValueError(f"ridge must be positive (A must be invertible), got {ridge!r}")
    eye = jnp.eye(dim, dtype=jnp.float32)
    return RouterState(
        jnp.broadcast_to(ridge * eye, (num_arms, dim, dim)),
        jnp.zeros((num_arms, dim), jnp.float32),
        jnp.zeros((num_arms,), jnp.int32),
    )


def _posterior(state: RouterState) -> tuple[jax.Array, jax.Array]:
    """Each arm's Cholesky factor ``L`` (``A_a = L Lᵀ``) and ``θ̂_a = A_a⁻¹ b_a``."""
    chol = jnp.linalg.cholesky(state.A)
    theta = jax.vmap(lambda L, b: jax.scipy.linalg.cho_solve((L, True), b))(chol, state.b)
    return chol, theta


def estimates(state: RouterState) -> jax.Array:
    """``θ̂_a`` of every arm, (arms, d): each arm's ridge-regression weights."""
    return _posterior(state)[1]


def scores(
    state: RouterState,
    x: jax.Array,
    key: jax.Array,
    *,
    method: str = "linucb",
    alpha: float = 1.0,
    noise: float = 0.5,
) -> jax.Array:
    """Each arm's score for features ``x`` (the module docstring's formulas); ``key`` is used by
    Thompson sampling only, ``alpha`` by LinUCB, ``noise`` (v) by Thompson sampling."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    x = jnp.asarray(x, jnp.float32)
    chol, theta = _posterior(state)
    if method == "linucb":
        whitened = jax.vmap(lambda L: jax.scipy.linalg.solve_triangular(L, x, lower=True))(chol)
        return theta @ x + alpha * jnp.sqrt(jnp.sum(whitened**2, axis=-1))  # xᵀA⁻¹x = |L⁻¹x|²
    z = jax.random.normal(key, theta.shape, theta.dtype)
    # L⁻ᵀz has covariance (L Lᵀ)⁻¹ = A⁻¹.
    spread = jax.vmap(lambda L, z: jax.scipy.linalg.solve_triangular(L.T, z, lower=False))(chol, z)
    return (theta + noise * spread) @ x


def select(state: RouterState, x: jax.Array, key: jax.Array, **options) -> jax.Array:
    """The arm with the highest score (the first on ties); options as for :func:`scores`."""
    return jnp.argmax(scores(state, x, key, **options))


def update(state: RouterState, arm: jax.Array, x: jax.Array, reward: jax.Array) -> RouterState:
    """Adds one observation to ``arm``'s regression: ``A += x xᵀ``, ``b += r x``."""
    x = jnp.asarray(x, jnp.float32)
    return RouterState(
        state.A.at[arm].add(jnp.outer(x, x)),
        state.b.at[arm].add(reward * x),
        state.count.at[arm].add(1),
    )


def reward(outcome, cost, cost_weight: float):
    """``outcome − λ_cost · cost``."""
    return outcome - cost_weight * cost


@functools.partial(jax.jit, static_argnames=("method", "alpha", "noise", "cost_weight"))
def replay(
    state: RouterState,
    contexts: jax.Array,
    outcomes: jax.Array,
    costs: jax.Array,
    key: jax.Array,
    *,
    method: str = "linucb",
    alpha: float = 1.0,
    noise: float = 0.5,
    cost_weight: float = 0.0,
) -> tuple[RouterState, jax.Array, jax.Array]:
    """Routes ``T`` requests (``contexts``, (T, d)) whose outcome and cost under every arm are
    known (``outcomes`` (T, arms); ``costs`` (T, arms) or (arms,)), learning from the chosen
    arm's reward only; returns the final state, the arms chosen (T,) and every arm's reward
    (T, arms), for :func:`cumulative_regret`."""
    rewards = reward(outcomes, jnp.broadcast_to(costs, outcomes.shape), cost_weight)

    def step(state, inputs):
        x, r, k = inputs
        arm = select(state, x, k, method=method, alpha=alpha, noise=noise)
        return update(state, arm, x, r[arm]), arm

    keys = jax.random.split(key, contexts.shape[0])
    state, chosen = jax.lax.scan(step, state, (contexts, rewards, keys))
    return state, chosen, rewards


def cumulative_regret(rewards: jax.Array, chosen: jax.Array, *, per_step: bool = False):
    """``R(t)`` for every t (the module docstring): against the best fixed arm of the first
    t steps, or with ``per_step`` the best arm of each step."""
    rewards = jnp.asarray(rewards)
    got = jnp.cumsum(jnp.take_along_axis(rewards, jnp.asarray(chosen)[:, None], axis=1)[:, 0])
    if per_step:
        return jnp.cumsum(rewards.max(axis=1)) - got
    return jnp.cumsum(rewards, axis=0).max(axis=1) - got


class Routed(NamedTuple):
    arm: str
    result: Any
    features: np.ndarray


@gin.configurable(module="multi_agent")
@dataclasses.dataclass(eq=False)
class Router:
    """Routes each request to one of ``arms`` (name -> callable of the request) by the bandit
    over ``features(request)`` (``dim`` numbers); :meth:`feedback` teaches it the outcome and
    cost.  Thread-safe: requests may be routed while others are fed back."""

    arms: Mapping[str, Callable[[Any], Any]]
    features: Callable[[Any], Sequence[float]]
    dim: int
    method: str = "linucb"
    alpha: float = 1.0
    noise: float = 0.5
    ridge: float = 1.0
    cost_weight: float = 0.0
    seed: int = 0

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        self.names = list(self.arms)
        self.state = init(len(self.names), self.dim, self.ridge)
        self.rewards: list[tuple[str, float]] = []  # (arm, reward) of every feedback
        self._key = jax.random.key(self.seed)
        self._lock = threading.Lock()
        options = dict(method=self.method, alpha=self.alpha, noise=self.noise)
        self._select = jax.jit(functools.partial(select, **options))
        self._update = jax.jit(update)

    def featurize(self, request: Any) -> np.ndarray:
        x = np.asarray(self.features(request), np.float32)
        if x.shape != (self.dim,):
            raise ValueError(f"features of a request must have shape ({self.dim},), got {x.shape}")
        return x

    def choose(self, request: Any) -> tuple[str, np.ndarray]:
        """The arm for ``request`` and its features."""
        x = self.featurize(request)
        with self._lock:
            self._key, key = jax.random.split(self._key)
            state = self.state
        return self.names[int(self._select(state, x, key))], x

    def route(self, request: Any) -> Routed:
        """Calls the chosen arm on ``request``."""
        arm, x = self.choose(request)
        return Routed(arm, self.arms[arm](request), x)

    def feedback(self, routed: Routed, outcome: float, cost: float = 0.0) -> float:
        """Learns from how ``routed`` went; returns its reward."""
        if routed.arm not in self.arms:
            raise ValueError(f"unknown arm {routed.arm!r}; the arms are {self.names}")
        r = float(reward(outcome, cost, self.cost_weight))
        with self._lock:
            self.state = self._update(self.state, self.names.index(routed.arm), routed.features, r)
            self.rewards.append((routed.arm, r))
        return r
