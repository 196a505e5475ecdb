"""Value-learning targets and losses for a single stream (rlax conventions).

Arrays are time-indexed: `x_tm1` at t−1, `x_t` at t, `discount_t = 0` at a
terminal step (γ·(1 − done) otherwise). Functions handle one trajectory
[T] (or one transition for the Q losses); `jax.vmap` them for batches.
Losses are per step, so any `aggregate` mode and masking apply on top.
GAE lives with the other advantage estimators (`advantages.gae`), the
per-step policy-gradient losses in `policy_gradients`.
"""

import jax
import jax.numpy as jnp

from agentic_jax.rl import validation as check

sg = jax.lax.stop_gradient


def td_error(v_tm1, r_t, discount_t, v_t, *, stop_target_gradients=True) -> jax.Array:
    """δ_t = r_t + γ_t·v_t − v_{t−1}, the one-step TD error (Sutton, 1988)."""
    v_tm1, r_t, discount_t, v_t = check.stream(v_tm1=v_tm1, r_t=r_t, discount_t=discount_t, v_t=v_t)
    target = r_t + discount_t * v_t
    return (sg(target) if stop_target_gradients else target) - v_tm1


# Scan bodies live at module level so that eager calls reuse their compilation.
def _lambda_return_step(g_next, xs):
    r, discount, v, lam = xs
    g = r + discount * ((1.0 - lam) * v + lam * g_next)
    return g, g


def lambda_returns(r_t, discount_t, v_t, lambda_=1.0, *, stop_target_gradients=False) -> jax.Array:
    """λ-returns G_t = r_t + γ_t·((1 − λ_t)·v_t + λ_t·G_{t+1}), bootstrapped from v_{T−1}.

    λ = 1 gives discounted Monte-Carlo returns (bootstrapped at the end),
    λ = 0 one-step TD targets; λ may be a scalar or per step [T].
    Sutton & Barto (2018), "Reinforcement Learning", ch. 12.
    """
    r_t, discount_t, v_t = check.stream(r_t=r_t, discount_t=discount_t, v_t=v_t)
    lambda_ = check.per_step("lambda_", lambda_, r_t.shape[0])
    _, returns = jax.lax.scan(
        _lambda_return_step, v_t[-1], (r_t, discount_t, v_t, lambda_), reverse=True
    )
    return sg(returns) if stop_target_gradients else returns


def td_lambda(v_tm1, r_t, discount_t, v_t, lambda_, *, stop_target_gradients=True) -> jax.Array:
    """TD(λ) errors G^λ_t − v_{t−1}; the loss is ½·error² (Sutton, 1988)."""
    v_tm1 = check.stream(v_tm1=v_tm1, r_t=r_t)[0]
    returns = lambda_returns(
        r_t, discount_t, v_t, lambda_, stop_target_gradients=stop_target_gradients
    )
    return returns - v_tm1


def _transition(q_tm1, a_tm1, r_t, discount_t, **next_q):
    q_tm1 = check.rank("q_tm1", check.floating("q_tm1", q_tm1), 1)
    a_tm1 = check.rank("a_tm1", check.integer("a_tm1", a_tm1), 0)
    r_t = check.rank("r_t", check.floating("r_t", r_t), 0)
    discount_t = check.rank("discount_t", check.floating("discount_t", discount_t), 0)
    next_q = [check.shape(name, check.floating(name, q), q_tm1.shape) for name, q in next_q.items()]
    return q_tm1, a_tm1, r_t, discount_t, next_q


def q_learning_loss(q_tm1, a_tm1, r_t, discount_t, q_t) -> jax.Array:
    """½·(r_t + γ_t·max_a q_t[a] − q_{t−1}[a_{t−1}])², one transition (vmap for batches).

    The target is not differentiated. Watkins & Dayan (1992), "Q-learning".
    """
    q_tm1, a_tm1, r_t, discount_t, (q_t,) = _transition(q_tm1, a_tm1, r_t, discount_t, q_t=q_t)
    target = sg(r_t + discount_t * jnp.max(q_t))
    return 0.5 * jnp.square(target - q_tm1[a_tm1])


def double_q_learning_loss(q_tm1, a_tm1, r_t, discount_t, q_t_value, q_t_selector) -> jax.Array:
    """½·(r_t + γ_t·q_t_value[argmax q_t_selector] − q_{t−1}[a_{t−1}])².

    Selecting with one estimate and evaluating with another removes the
    maximisation bias of Q-learning. van Hasselt (2010), "Double Q-learning";
    van Hasselt et al. (2016), arXiv:1509.06461.
    """
    q_tm1, a_tm1, r_t, discount_t, (q_value, q_selector) = _transition(
        q_tm1, a_tm1, r_t, discount_t, q_t_value=q_t_value, q_t_selector=q_t_selector
    )
    target = sg(r_t + discount_t * q_value[jnp.argmax(q_selector)])
    return 0.5 * jnp.square(target - q_tm1[a_tm1])


def ppo_value_loss(v_t, old_v_t, return_t, epsilon: float = 0.2) -> jax.Array:
    """½·max((v − R)², (v_old + clip(v − v_old, −ε, ε) − R)²) per step.

    The clipped value loss keeps the critic near its rollout-time values.
    OpenAI baselines PPO2; analysed in Engstrom et al. (2020), arXiv:2005.12729.
    """
    v_t, old_v_t, return_t = check.stream(v_t=v_t, old_v_t=old_v_t, return_t=return_t)
    return_t, old_v_t = sg(return_t), sg(old_v_t)
    clipped = old_v_t + jnp.clip(v_t - old_v_t, -epsilon, epsilon)
    return 0.5 * jnp.maximum(jnp.square(v_t - return_t), jnp.square(clipped - return_t))


def potential_shaping(r_t, discount_t, potential_tm1, potential_t) -> jax.Array:
    """r_t + γ_t·Φ(s_t) − Φ(s_{t−1}): reward shaping that keeps optimal policies.

    The shaping terms telescope, so returns change by −Φ(s_0) only (with
    `discount_t = 0` at the end of an episode). Ng, Harada & Russell (1999),
    "Policy invariance under reward transformations".
    """
    r_t, discount_t, potential_tm1, potential_t = check.stream(
        r_t=r_t, discount_t=discount_t, potential_tm1=potential_tm1, potential_t=potential_t
    )
    return r_t + discount_t * potential_t - potential_tm1
