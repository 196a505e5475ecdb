"""Explicit termination: every agent run ends with a :class:`StopReason` and a sentence saying why.

An agent loop without hard limits can spin forever on a model that never answers, so each run
carries a :class:`Budget` (steps, tokens, cost, wall time) and checks it before every model call.
Cost is tokens times a :class:`Pricing`; with a local model it is zero unless priced, but the same
accounting then tells what a run would cost against a hosted API.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable

import gin

from agentic_jax.agents.policies.base import Usage


class StopReason(str, enum.Enum):
    ANSWER = "answer"  # the policy answered (and, where there is a verifier, it passed)
    MAX_STEPS = "max_steps"
    TOKEN_BUDGET = "token_budget"
    COST_BUDGET = "cost_budget"
    WALL_TIME = "wall_time"
    REPEATED_CALL = "repeated_call"  # the same tool call again after a redirect
    NO_PROGRESS = "no_progress"  # tool results stopped bringing anything new
    MAX_ATTEMPTS = "max_attempts"  # Reflexion / verify-retry ran out of attempts
    POLICY_ERROR = "policy_error"
    MAX_TURNS = "max_turns"  # a conversation's limit of replies to its user came first
    REJECTED = "rejected"  # a human rejected the run at an approval gate
    # Multi-agent runs (``multi_agent``):
    MAX_ROUNDS = "max_rounds"  # the round limit came before an agreement or a final answer
    MAX_MESSAGES = "max_messages"
    AGENTS_FAILED = "agents_failed"  # no member left that could do the work


@gin.configurable(module="agents")
@dataclasses.dataclass(frozen=True)
class Pricing:
    """US dollars per 1000 prompt / completion tokens."""

    prompt_per_1k: float = 0.0
    completion_per_1k: float = 0.0

    def cost(self, usage: Usage) -> float:
        return (
            usage.prompt_tokens * self.prompt_per_1k
            + usage.completion_tokens * self.completion_per_1k
        ) / 1000


@gin.configurable(module="agents")
@dataclasses.dataclass(frozen=True)
class Budget:
    """Limits of one run; ``None`` switches a limit off.  ``max_steps`` counts model calls."""

    max_steps: int | None = 10
    max_tokens: int | None = None
    max_cost: float | None = None
    max_wall_s: float | None = None


class BudgetTracker:
    """What a run has spent; shared by the sub-runs of a plan so the limits hold for the whole."""

    def __init__(
        self,
        budget: Budget = Budget(),
        pricing: Pricing = Pricing(),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.budget, self.pricing, self.clock = budget, pricing, clock
        self.start = clock()
        self.steps = 0
        self.usage = Usage()

    @property
    def cost(self) -> float:
        return self.pricing.cost(self.usage)

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def charge(self, usage: Usage) -> None:
        """Counts one model call and its tokens."""
        self.steps += 1
        self.usage = self.usage + usage

    def remaining_tokens(self) -> int | None:
        if self.budget.max_tokens is None:
            return None
        return max(0, self.budget.max_tokens - self.usage.total_tokens)

    def exceeded(self) -> tuple[StopReason, str] | None:
        """The first limit reached, with its reason, or ``None`` if another call may start."""
        b = self.budget
        if b.max_steps is not None and self.steps >= b.max_steps:
            return StopReason.MAX_STEPS, f"reached max_steps={b.max_steps} model calls"
        if b.max_tokens is not None and self.usage.total_tokens >= b.max_tokens:
            return StopReason.TOKEN_BUDGET, (
                f"used {self.usage.total_tokens} tokens of max_tokens={b.max_tokens}"
            )
        if b.max_cost is not None and self.cost >= b.max_cost:
            return StopReason.COST_BUDGET, f"spent ${self.cost:.4f} of max_cost=${b.max_cost}"
        if b.max_wall_s is not None and self.elapsed >= b.max_wall_s:
            return StopReason.WALL_TIME, (f"ran {self.elapsed:.1f}s of max_wall_s={b.max_wall_s}")
        return None
