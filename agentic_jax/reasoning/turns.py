"""Steps that are agent turns: search over tool-using episodes of a text environment.

A :class:`TurnModel` is a :class:`StepModel` whose step is one whole assistant turn, executed
by a ``HostTextEnv``: a tool call runs (on the env's tool pool) and its tool message and the next
assistant prompt join the transcript; an answer ends the episode with the verifier's reward.  A
step's tokens are the turn *and* what the environment appended after it, so a state's tokens are
still its prompt followed by its steps, and a process reward model scoring a prefix sees each tool
result.  Every search in this package (sampling and selection, beam search, DVTS, Tree-of-Thoughts,
MCTS through ``StepTree``) runs on it unchanged: start from :meth:`TurnModel.roots` and select by
:func:`episode_return` (the verifier: oracle best-of-N) or by a reward model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gin
import jax
import numpy as np

from agentic_jax.envs.host import HostTextEnv, HostTextState
from agentic_jax.reasoning.budget import Budget
from agentic_jax.reasoning.steps import State, StepModel


def _row(episodes: HostTextState, row: int) -> HostTextState:
    return jax.tree.map(lambda a: a[row : row + 1], episodes)


def _stack(episodes: Sequence[HostTextState]) -> HostTextState:
    return jax.tree.map(lambda *rows: np.concatenate(rows), *episodes)


def episode_return(states: Sequence[State]) -> np.ndarray:
    """The environment's reward so far of each state: a :data:`Scorer` that is the verifier."""
    return np.array([s.reward for s in states], np.float64)


@gin.configurable(module="reasoning")
@dataclasses.dataclass
class TurnModel(StepModel):
    """A step model over ``env``'s episodes: a step ends where the env's turns end (its stop
    tokens), or after ``max_step_tokens`` (default: the env's ``action_length``)."""

    env: HostTextEnv | None = None
    delimiters: tuple[str, ...] = ()
    max_step_tokens: int | None = None

    def __post_init__(self):
        if not isinstance(self.env, HostTextEnv):
            raise ValueError(f"TurnModel needs a HostTextEnv, got {type(self.env).__name__}")
        if self.env.max_length > self.config.max_seq_len:
            raise ValueError(
                f"the env's transcripts (max_length={self.env.max_length}) do not fit the "
                f"model's max_seq_len={self.config.max_seq_len}"
            )
        if self.max_step_tokens is None:
            self.max_step_tokens = self.env.action_length
        if self.max_step_tokens > self.env.action_length:
            raise ValueError(
                f"max_step_tokens={self.max_step_tokens} exceeds the env's action_length="
                f"{self.env.action_length}"
            )
        if self.stop_token_ids is None:
            self.stop_token_ids = tuple(int(t) for t in self.env.stop_ids)
        super().__post_init__()

    def roots(self, tasks: Sequence[int]) -> list[State]:
        """The first observation of an episode of each of ``tasks`` (rows of the env's task list)."""
        obs, episodes = self.env.reset_tasks(tasks)
        return [
            State(
                tuple(int(t) for t in obs["tokens"][row, : obs["length"][row]]),
                int(obs["length"][row]),
                episode=_row(episodes, row),
            )
            for row in range(len(tasks))
        ]

    def expand(
        self,
        states: Sequence[State],
        k: int,
        *,
        key,
        temperature: float = 1.0,
        budget: Budget | None = None,
        context: Sequence[int] = (),
    ) -> list[list[State]]:
        """``k`` sampled turns for each live state (one decoder call), each then stepped by the
        environment (one batched env step)."""
        if any(s.episode is None for s in states if not s.done):
            raise ValueError("TurnModel expands episode states: start from TurnModel.roots")
        sampled = super().expand(
            states, k, key=key, temperature=temperature, budget=budget, context=context
        )
        flat = [(i, c) for i, kids in enumerate(sampled) for c in kids]
        children: list[list[State]] = [[] for _ in states]
        if not flat:
            return children
        actions = np.full((len(flat), self.env.action_length), self.env.pad_id, np.int32)
        for row, (_, child) in enumerate(flat):
            actions[row, : len(child.steps[-1])] = child.steps[-1]
        obs, episodes, reward, terminated, truncated, _ = self.env.step_env(
            _stack([states[i].episode for i, _ in flat]), actions
        )
        for row, (i, child) in enumerate(flat):
            parent = states[i]
            tokens = tuple(int(t) for t in obs["tokens"][row, : obs["length"][row]])
            children[i].append(
                dataclasses.replace(
                    child,
                    tokens=tokens,
                    steps=parent.steps + (tokens[len(parent.tokens) :],),
                    done=bool(terminated[row] or truncated[row]),
                    reward=parent.reward + float(reward[row]),
                    episode=_row(episodes, row),
                )
            )
        return children
