"""Generate-verify-retry with adaptive budgets.

When answers can be checked more cheaply than produced (unit tests for code, substitution for an
equation, a schema for JSON), sampling, checking and retrying with the verifier's feedback beats
trusting one sample.  The generation budget adapts: each retry may use ``growth`` times the
previous attempt's ``max_tokens`` (a truncated or rushed answer gets room to think), capped by
``max_tokens_cap`` and by what is left of the run's token budget; when what is left cannot pay for
a minimal attempt, the run stops with ``token_budget`` rather than wasting a call.
"""

from __future__ import annotations

from collections.abc import Callable

from agentic_jax.agents.context.tracing import Tracer
from agentic_jax.agents.loops.agent import AgentResult, BudgetExceeded, Evaluation, Outcome, Run
from agentic_jax.agents.policies.base import Policy, PolicyError
from agentic_jax.agents.tools.budget import Budget, BudgetTracker, Pricing, StopReason
from agentic_jax.data.chat import Message

Verifier = Callable[[str, str], Evaluation]
SYSTEM_PROMPT = "Solve the task. Reply with the answer only."


class GenerateVerifyRetry:
    def __init__(
        self,
        policy: Policy,
        verifier: Verifier,
        *,
        max_attempts: int = 4,
        max_tokens: int = 128,
        growth: float = 2.0,
        max_tokens_cap: int = 2048,
        min_tokens: int = 16,
        system_prompt: str = SYSTEM_PROMPT,
        budget: Budget = Budget(max_steps=100),
        pricing: Pricing = Pricing(),
        tracer: Tracer | None = None,
        sampling: dict | None = None,
    ):
        self.policy, self.verifier, self.max_attempts = policy, verifier, max_attempts
        self.max_tokens, self.growth, self.max_tokens_cap = max_tokens, growth, max_tokens_cap
        self.min_tokens, self.system_prompt = min_tokens, system_prompt
        self.budget, self.pricing, self.tracer = budget, pricing, tracer
        self.sampling = dict(sampling or {})

    def run(self, task: str) -> AgentResult:
        run = Run(BudgetTracker(self.budget, self.pricing), self.tracer)
        run.start(task, "generate_verify_retry")
        return run.finish(task, self._run(run, task))

    def _run(self, run: Run, task: str) -> Outcome:
        messages = [Message("system", self.system_prompt), Message("user", task)]
        allowance = self.max_tokens
        for attempt in range(1, self.max_attempts + 1):
            remaining = run.tracker.remaining_tokens()
            if remaining is not None and remaining < self.min_tokens:
                run.decide(
                    "stop",
                    f"{remaining} tokens left, less than one attempt's {self.min_tokens}",
                    reason=StopReason.TOKEN_BUDGET.value,
                )
                return Outcome(
                    None,
                    StopReason.TOKEN_BUDGET,
                    f"{remaining} tokens left cannot pay for another attempt",
                    messages,
                )
            try:
                reply = run.model(
                    self.policy, messages, **{**self.sampling, "max_tokens": allowance}
                )
            except BudgetExceeded as e:
                return Outcome(None, e.reason, e.detail, messages)
            except PolicyError as e:
                return Outcome(None, StopReason.POLICY_ERROR, str(e), messages)
            messages.append(reply.to_message())
            verdict = self.verifier(task, reply.text)
            run.decide(
                "verify",
                f"attempt {attempt} with max_tokens={allowance}: "
                + ("passed" if verdict.success else f"failed: {verdict.feedback}"),
                max_tokens=allowance,
            )
            if verdict.success:
                return Outcome(
                    reply.text,
                    StopReason.ANSWER,
                    f"the verifier accepted attempt {attempt}",
                    messages,
                )
            messages.append(
                Message(
                    "user",
                    f"A verifier rejected that answer: {verdict.feedback or 'wrong'}. Try again.",
                )
            )
            allowance = min(self.max_tokens_cap, int(allowance * self.growth))
        return Outcome(
            None,
            StopReason.MAX_ATTEMPTS,
            f"the verifier rejected all {self.max_attempts} attempts",
            messages,
        )
