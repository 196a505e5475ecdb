"""Finite MDPs given by tables, their exact solution, and two classic instances.

`TabularMDP` samples s' ~ P(·|s, a) and pays R(s, a, s'); an episode
terminates on entering a terminal state. Because the model is explicit,
`value_iteration` (Bellman, 1957) computes the optimal Q*, V* to machine
precision and `policy_evaluation` solves V^π = R_π + γ·P_π·V^π exactly,
the references the tabular agents are tested against.
Sutton & Barto (2018), ch. 4.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env

LEFT, RIGHT = 0, 1
UP, DOWN, WEST, EAST = 0, 1, 2, 3


@struct.dataclass
class TabularParams:
    """P[s, a, s'] (rows sum to 1), R[s, a, s'], terminal[s], initial[s] (sums to 1)."""

    transitions: jax.Array
    rewards: jax.Array
    terminal: jax.Array
    initial: jax.Array


@struct.dataclass
class TabularState:
    state: jax.Array
    time: jax.Array


class TabularMDP(Env):
    """An MDP from its tables; the observation is the state index."""

    def __init__(self, params: TabularParams):
        self._params = params
        self.num_states, self.num_actions = (int(d) for d in params.transitions.shape[:2])

    @property
    def default_params(self):
        return self._params

    def reset_env(self, key, params):
        s = jax.random.categorical(key, jnp.log(params.initial)).astype(jnp.int32)
        return s, TabularState(s, jnp.int32(0))

    def step_env(self, key, state, action, params):
        s = state.state
        next_s = jax.random.categorical(key, jnp.log(params.transitions[s, action])).astype(
            jnp.int32
        )
        reward = params.rewards[s, action, next_s]
        return (
            next_s,
            TabularState(next_s, state.time + 1),
            reward,
            params.terminal[next_s],
            jnp.bool_(False),
            {},
        )

    def observation_space(self, params=None):
        return spaces.Discrete(self.num_states)

    def action_space(self, params=None):
        return spaces.Discrete(self.num_actions)


def _expected(params: TabularParams, gamma: float, v: jax.Array) -> jax.Array:
    """Q[s, a] = Σ_s' P(s'|s, a)·(R(s, a, s') + γ·(1 − terminal[s'])·V[s'])."""
    continuation = jnp.where(params.terminal, 0.0, v)
    return jnp.einsum(
        "sat,sat->sa", params.transitions, params.rewards + gamma * continuation[None, None, :]
    )


def value_iteration(
    params: TabularParams, gamma: float, tol: float = 1e-6, max_iters: int = 10_000
):
    """Optimal (V*, Q*) by V ← max_a Q(V) until the sup-norm change is below `tol`.

    Values of terminal states are never used (the episode has ended) and are
    reported as 0.
    """

    def cond(carry):
        i, _, delta = carry
        return (i < max_iters) & (delta > tol)

    def body(carry):
        i, v, _ = carry
        new_v = jnp.where(params.terminal, 0.0, jnp.max(_expected(params, gamma, v), axis=1))
        return i + 1, new_v, jnp.max(jnp.abs(new_v - v))

    v0 = jnp.zeros(params.terminal.shape, jnp.float32)
    _, v, _ = jax.lax.while_loop(cond, body, (0, v0, jnp.float32(jnp.inf)))
    return v, _expected(params, gamma, v)


def policy_evaluation(params: TabularParams, policy: jax.Array, gamma: float) -> jax.Array:
    """Exact V^π for a stochastic policy π[s, a] (one linear solve); 0 at terminal states."""
    alive = ~params.terminal
    p_pi = jnp.einsum("sa,sat->st", policy, params.transitions) * alive[None, :]
    r_pi = jnp.einsum("sa,sat,sat->s", policy, params.transitions, params.rewards)
    n = params.terminal.shape[0]
    v = jnp.linalg.solve(jnp.eye(n) - gamma * p_pi, r_pi)
    return jnp.where(alive, v, 0.0)


def _params(transitions, rewards, terminal, initial) -> TabularParams:
    return TabularParams(
        jnp.asarray(transitions, jnp.float32),
        jnp.asarray(rewards, jnp.float32),
        jnp.asarray(terminal, bool),
        jnp.asarray(initial / initial.sum(), jnp.float32),
    )


def chain_mdp(
    num_states: int = 8, slip: float = 0.1, goal_reward: float = 1.0, wall_reward: float = 0.01
):
    """A corridor: LEFT / RIGHT move one cell (flipped with probability `slip`).

    Entering the right end pays `goal_reward` and terminates; bumping into the
    left wall pays a small `wall_reward` (a distractor). Episodes start in a
    uniformly random non-terminal cell, so every state is visited.
    """
    n = num_states
    transitions = np.zeros((n, 2, n))
    rewards = np.zeros((n, 2, n))
    for s in range(n):
        for a, move in ((LEFT, -1), (RIGHT, 1)):
            for prob, step in ((1.0 - slip, move), (slip, -move)):
                transitions[s, a, min(max(s + step, 0), n - 1)] += prob
        rewards[s, :, n - 1] = goal_reward
    rewards[0, :, 0] = wall_reward
    terminal = np.arange(n) == n - 1
    return TabularMDP(_params(transitions, rewards, terminal, (~terminal).astype(float)))


def grid_mdp(
    height: int = 4,
    width: int = 4,
    slip: float = 0.1,
    goal=None,
    pits=((1, 1),),
    step_reward: float = 0.0,
):
    """A gridworld: four moves (a random move with probability `slip`), walls keep you in place.

    Reaching `goal` (default: bottom-right) pays +1, a pit −1; both terminate.
    Episodes start in the top-left cell. State index = row·width + column.
    """
    goal = (height - 1, width - 1) if goal is None else goal
    n = height * width
    moves = {UP: (-1, 0), DOWN: (1, 0), WEST: (0, -1), EAST: (0, 1)}
    transitions = np.zeros((n, 4, n))
    for r in range(height):
        for c in range(width):
            for a in moves:
                for b, (dr, dc) in moves.items():
                    prob = (1.0 - slip) * (a == b) + slip / 4
                    nr, nc = min(max(r + dr, 0), height - 1), min(max(c + dc, 0), width - 1)
                    transitions[r * width + c, a, nr * width + nc] += prob
    cell_reward = np.full(n, step_reward)
    cell_reward[goal[0] * width + goal[1]] = 1.0
    terminal = np.zeros(n, bool)
    terminal[goal[0] * width + goal[1]] = True
    for r, c in pits:
        cell_reward[r * width + c], terminal[r * width + c] = -1.0, True
    rewards = np.broadcast_to(cell_reward[None, None, :], (n, 4, n))
    initial = np.eye(n)[0]
    return TabularMDP(_params(transitions, rewards, terminal, initial))
