"""A policy that samples several turns from another and answers with the majority's.

Self-consistency (Wang et al. 2022, arXiv:2203.11171) at the level of agent turns, so it works
in any agent loop and over any backend: each of ``n`` sampled turns is reduced to a key (the
tool calls it makes, with canonical JSON arguments; otherwise its ``<answer>``, or its stripped
text), the keys are voted on with ``reasoning.majority_vote`` (weighted by ``weight(turn)``
when given, e.g. a reward model's score: weighted best-of-N), and the first sampled turn with
the winning key is returned.  Its usage is the sum over all ``n`` samples, so context and token
budgets charge what the vote really cost.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

import gin

from agentic_jax.agents.policies.base import AssistantMessage, Policy, Usage
from agentic_jax.envs.text.rewards import answer_text
from agentic_jax.reasoning import majority_vote


def turn_key(turn: AssistantMessage) -> tuple:
    """What two turns must share to count as the same vote."""
    if turn.tool_calls:
        return ("calls",) + tuple(
            (c.name, json.dumps(c.arguments, sort_keys=True)) for c in turn.tool_calls
        )
    answer = answer_text(turn.text)
    return ("answer", answer) if answer is not None else ("text", turn.text.strip())


@gin.configurable(module="agents")
class VotingPolicy:
    """``n`` turns from ``policy``, always sampled at this policy's ``temperature`` (a greedy
    request would make ``n`` copies of one turn), with seeds ``seed``, ``seed + 1``, ... when
    the request has a seed; and the majority's turn."""

    def __init__(
        self,
        policy: Policy,
        n: int = 5,
        *,
        temperature: float = 0.7,
        weight: Callable[[AssistantMessage], float] | None = None,
    ):
        if n < 1:
            raise ValueError(f"VotingPolicy needs n >= 1 samples, got {n}")
        self.policy, self.n, self.temperature, self.weight = policy, n, temperature, weight

    def respond(self, messages, tools=(), **sampling) -> AssistantMessage:
        sampling = {**sampling, "temperature": self.temperature}
        seed = sampling.pop("seed", None)
        turns = [
            self.policy.respond(
                messages, tools, **sampling, **({} if seed is None else {"seed": seed + i})
            )
            for i in range(self.n)
        ]
        keys = [turn_key(t) for t in turns]
        weights = None if self.weight is None else [self.weight(t) for t in turns]
        winner = majority_vote(keys, weights)
        chosen = turns[keys.index(winner)]
        usage = sum((t.usage for t in turns), Usage())
        return dataclasses.replace(chosen, usage=usage)

    def close(self) -> None:
        close = getattr(self.policy, "close", None)
        if close is not None:
            close()
