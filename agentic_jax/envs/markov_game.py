"""Markov games: several agents acting at once in the functional environment API.

A Markov (stochastic) game (Shapley, 1953; Littman, 1994, "Markov games as a framework for
multi-agent reinforcement learning") is an MDP whose action is the *joint* action of N agents and
whose reward is one number per agent.  A :class:`MarkovGame` is an :class:`~agentic_jax.envs.Env`
whose

* observation is a :class:`GameObservation`: each agent's own view ``local`` ``[N, D]`` (what a
  decentralised actor sees), the global ``state`` ``[S]`` (what a centralised critic may see during
  training, Lowe et al., 2017, arXiv:1706.02275), and ``mask`` ``[N]``: the agents that act this
  step (turn-based games leave the others idle; their actions are ignored and must not be learned
  from);
* action is the joint action ``[N]`` (int32, one Discrete choice per agent);
* reward is ``[N]`` float32, one per agent; ``terminated`` / ``truncated`` end the episode for
  everyone (auto-reset as in ``Env.step``).

So ``rollout`` / ``run_steps`` / ``Vectorized`` run games unchanged (a joint policy maps one
``GameObservation`` to ``[N]`` actions), and everything stays jit/vmap/scan-friendly.

Games here: :class:`MatrixGame` (one simultaneous move; its Nash equilibria are known in closed
form, and :meth:`MatrixGame.nash_conv` measures how far a policy profile is from one) and
:class:`SignallingGame` (a Lewis signalling game: communication is part of the action, and the
optimum needs a learned code).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from agentic_jax.envs import spaces
from agentic_jax.envs.core import Env, EnvState


@struct.dataclass
class GameObservation:
    """``local`` ``[N, D]`` per-agent views, ``state`` ``[S]`` global, ``mask`` ``[N]`` who acts."""

    local: jax.Array
    state: jax.Array
    mask: jax.Array


class MarkovGame(Env):
    """An :class:`Env` over joint actions; subclasses set ``num_agents`` and the spaces.

    ``observation_space`` describes one agent's ``local`` row, ``state_space`` the global state
    and ``action_space`` one agent's choice (the same for every agent).
    """

    num_agents: int

    def state_space(self, params=None) -> spaces.Box:
        raise NotImplementedError


# Payoffs [2, A, A]: payoffs[i, a, b] is player i's reward when player 0 plays a and player 1 b.
PRISONERS_DILEMMA = ((3.0, 0.0), (5.0, 1.0)), ((3.0, 5.0), (0.0, 1.0))  # 0 cooperate, 1 defect
MATCHING_PENNIES = ((1.0, -1.0), (-1.0, 1.0)), ((-1.0, 1.0), (1.0, -1.0))
STAG_HUNT = ((4.0, 0.0), (3.0, 2.0)), ((4.0, 3.0), (0.0, 2.0))  # 0 stag, 1 hare
ROCK_PAPER_SCISSORS = (
    ((0.0, -1.0, 1.0), (1.0, 0.0, -1.0), (-1.0, 1.0, 0.0)),
    ((0.0, 1.0, -1.0), (-1.0, 0.0, 1.0), (1.0, -1.0, 0.0)),
)
GAMES = {
    "prisoners_dilemma": PRISONERS_DILEMMA,
    "matching_pennies": MATCHING_PENNIES,
    "stag_hunt": STAG_HUNT,
    "rock_paper_scissors": ROCK_PAPER_SCISSORS,
}


class MatrixGame(MarkovGame):
    """A two-player normal-form game played once per episode.

    ``payoffs``: a name from :data:`GAMES` or an array ``[2, A, A]`` (player ``i``'s reward for
    the joint action ``(a, b)`` is ``payoffs[i, a, b]``).  Both players see a constant
    observation: all they can learn is a mixed strategy, and the game's equilibria are the
    targets (prisoner's dilemma: both defect; matching pennies and rock-paper-scissors: uniform).
    """

    num_agents = 2

    def __init__(self, payoffs="prisoners_dilemma"):
        if isinstance(payoffs, str):
            if payoffs not in GAMES:
                raise ValueError(f"unknown matrix game {payoffs!r}; known: {sorted(GAMES)}")
            payoffs = GAMES[payoffs]
        payoffs = np.asarray(payoffs, np.float32)
        if payoffs.ndim != 3 or payoffs.shape[0] != 2 or payoffs.shape[1] != payoffs.shape[2]:
            raise ValueError(f"payoffs must have shape [2, A, A], got {payoffs.shape}")
        self.payoffs = payoffs

    @property
    def num_actions(self) -> int:
        return self.payoffs.shape[1]

    def _observe(self) -> GameObservation:
        return GameObservation(jnp.ones((2, 1)), jnp.ones((1,)), jnp.ones((2,), bool))

    def reset_env(self, key, params):
        return self._observe(), EnvState(time=jnp.int32(0))

    def step_env(self, key, state, action, params):
        action = jnp.asarray(action, jnp.int32)
        reward = jnp.asarray(self.payoffs)[:, action[0], action[1]]
        return self._observe(), EnvState(state.time + 1), reward, True, False, {}

    def observation_space(self, params=None):
        return spaces.Box(1.0, 1.0, (1,))

    def state_space(self, params=None):
        return spaces.Box(1.0, 1.0, (1,))

    def action_space(self, params=None):
        return spaces.Discrete(self.num_actions)

    def values(self, policies) -> np.ndarray:
        """Each player's expected payoff ``[2]`` under mixed strategies ``policies`` ``[2, A]``."""
        p = np.asarray(policies, np.float64)
        return np.einsum("a,b,iab->i", p[0], p[1], self.payoffs)

    def nash_conv(self, policies) -> float:
        """Σ_i (best-response value_i − value_i): 0 exactly at a Nash equilibrium (the sum of
        what each player would gain by deviating alone; Lanctot et al., 2017, arXiv:1711.00832)."""
        p = np.asarray(policies, np.float64)
        best = [
            np.max(self.payoffs[0] @ p[1]),  # player 0's best reply to player 1's strategy
            np.max(p[0] @ self.payoffs[1]),
        ]
        return float(np.sum(best) - np.sum(self.values(p)))


class SignallingGame(MarkovGame):
    """A Lewis signalling game: learned communication, where the message *is* an action.

    Step 0: the speaker (agent 0) sees a target drawn uniformly from ``num_targets`` and sends a
    message (its action, one of ``num_targets`` symbols); the listener is masked out.  Step 1: the
    listener (agent 1) sees only the message and guesses the target; the speaker is masked out.
    Both get 1 if the guess is right (a shared reward).  A policy pair that solves it has agreed a
    code; the optimum return is 1, guessing earns ``1 / num_targets``.  The global state (the
    target, the message, the step) is what a centralised critic sees.
    """

    num_agents = 2

    def __init__(self, num_targets: int = 3):
        if num_targets < 2:
            raise ValueError(f"num_targets must be at least 2, got {num_targets}")
        self.num_targets = num_targets

    @struct.dataclass
    class State(EnvState):
        target: jax.Array
        message: jax.Array

    def _observe(self, state) -> GameObservation:
        k = self.num_targets
        speaking = state.time == 0
        target = jax.nn.one_hot(state.target, k)
        message = jax.nn.one_hot(state.message, k) * (~speaking)
        local = jnp.stack([target * speaking, message])
        global_state = jnp.concatenate([target, message, speaking[None].astype(jnp.float32)])
        return GameObservation(local, global_state, jnp.stack([speaking, ~speaking]))

    def reset_env(self, key, params):
        target = jax.random.randint(key, (), 0, self.num_targets)
        state = self.State(time=jnp.int32(0), target=target, message=jnp.int32(0))
        return self._observe(state), state

    def step_env(self, key, state, action, params):
        action = jnp.asarray(action, jnp.int32)
        speaking = state.time == 0
        message = jnp.where(speaking, action[0], state.message)
        correct = (~speaking) & (action[1] == state.target)
        next_state = self.State(time=state.time + 1, target=state.target, message=message)
        reward = jnp.full((2,), correct, jnp.float32)
        return self._observe(next_state), next_state, reward, ~speaking, False, {}

    def observation_space(self, params=None):
        return spaces.Box(0.0, 1.0, (self.num_targets,))

    def state_space(self, params=None):
        return spaces.Box(0.0, 1.0, (2 * self.num_targets + 1,))

    def action_space(self, params=None):
        return spaces.Discrete(self.num_targets)
