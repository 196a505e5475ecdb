"""Plan-and-execute: write a plan, carry out its steps one by one, re-plan when a step fails.

Planning once up front (Wang et al. 2023, *Plan-and-Solve Prompting*; the plan-and-execute agents
of LangChain and BabyAGI) keeps a long task on course better than a single ReAct loop, whose
context fills with the details of early steps.  Here each step runs as its own ReAct sub-loop that
sees the task, the plan and the results so far, inside one shared budget and trace.  A step fails
when its sub-loop ends without an answer (loop detected, no progress, policy error) or answers
``FAILED: <why>``; the planner then writes a new plan for what is left, at most ``max_replans``
times.  Running out of budget ends the whole run.  A final call turns the step results into the
answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agentic_jax.agents.context.tracing import Tracer
from agentic_jax.agents.loops.agent import BUDGET_STOPS, AgentResult, BudgetExceeded, Outcome, Run
from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import PolicyError
from agentic_jax.agents.tools.budget import Budget, BudgetTracker, Pricing, StopReason
from agentic_jax.data.chat import Message

PLANNER_PROMPT = (
    "You plan how to solve tasks. Reply with a short numbered list of steps, one per "
    "line, each doable with the available tools. No other text."
)
STEP_PROMPT = (
    "Carry out one step of a plan. Reply with the step's result and no tool call when "
    "it is done; if it cannot be done, reply 'FAILED: <why>'."
)
FINAL_PROMPT = "Answer the task from the results of the plan's steps. Reply with the answer only."
_STEP_LINE = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(.*\S)")
_FAILED = re.compile(r"^\s*FAILED:")  # STEP_PROMPT's marker; not "Failed logins: 3"


def parse_plan(text: str) -> list[str]:
    """Numbered or bulleted lines; plain non-empty lines if there are none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    steps = [m.group(1) for m in map(_STEP_LINE.match, lines) if m]
    return steps or lines


def _results(done: Sequence[tuple[str, str]]) -> str:
    lines = [f"{i}. {step} -> {result}" for i, (step, result) in enumerate(done, 1)]
    return "\n".join(lines) or "none"


class PlanAndExecute:
    """Plan, execute with ``executor`` (a :class:`ReActAgent` whose policy and tools run the
    steps), re-plan on failure; ``policy`` plans and writes the final answer."""

    def __init__(
        self,
        policy,
        executor: ReActAgent,
        *,
        max_replans: int = 2,
        budget: Budget = Budget(max_steps=30),
        pricing: Pricing = Pricing(),
        tracer: Tracer | None = None,
    ):
        self.policy, self.executor, self.max_replans = policy, executor, max_replans
        self.budget, self.pricing, self.tracer = budget, pricing, tracer

    def _plan(self, run: Run, task: str, done, failure: str | None) -> list[str]:
        request = f"Task: {task}\nCompleted steps:\n{_results(done)}"
        if failure:
            request += f"\nThe last step failed: {failure}\nPlan only the remaining steps."
        tools = self.executor.executor.available()
        if tools:
            request += "\nTools: " + ", ".join(f"{t.name} ({t.description})" for t in tools)
        reply = run.model(
            self.policy, [Message("system", PLANNER_PROMPT), Message("user", request)]
        )
        steps = parse_plan(reply.text)
        run.decide("replan" if failure else "plan", "; ".join(steps), steps=steps)
        return steps

    def run(self, task: str) -> AgentResult:
        run = Run(BudgetTracker(self.budget, self.pricing), self.tracer)
        run.start(task, "plan_execute")
        return run.finish(task, self._run(run, task))

    def _run(self, run: Run, task: str) -> Outcome:
        messages: list[Message] = []
        done: list[tuple[str, str]] = []
        replans = 0
        try:
            plan = self._plan(run, task, done, None)
            while plan:
                step, plan = plan[0], plan[1:]
                request = (
                    f"Task: {task}\nPlan: {'; '.join([s for s, _ in done] + [step] + plan)}"
                    f"\nResults so far:\n{_results(done)}\nNow do this step: {step}"
                )
                sub = self.executor.loop(run, request, system_prompt=STEP_PROMPT)
                messages += sub.messages
                if sub.reason in BUDGET_STOPS:
                    return Outcome(None, sub.reason, sub.detail, messages)
                if sub.reason is StopReason.ANSWER and not _FAILED.match(sub.answer or ""):
                    done.append((step, sub.answer))
                    run.decide("step_done", f"{step} -> {sub.answer}")
                    continue
                failure = f"{step}: {sub.answer or sub.detail}"
                if replans >= self.max_replans:
                    return Outcome(
                        None,
                        StopReason.MAX_ATTEMPTS,
                        f"step failed after {replans} re-plans: {failure}",
                        messages,
                    )
                replans += 1
                plan = self._plan(run, task, done, failure)
            final = run.model(
                self.policy,
                [
                    Message("system", FINAL_PROMPT),
                    Message("user", f"Task: {task}\nResults:\n{_results(done)}"),
                ],
            )
        except BudgetExceeded as e:
            return Outcome(None, e.reason, e.detail, messages)
        except PolicyError as e:
            run.decide("stop", str(e), reason=StopReason.POLICY_ERROR.value)
            return Outcome(None, StopReason.POLICY_ERROR, str(e), messages)
        run.decide("answer", f"{len(done)} steps done, {replans} re-plans")
        return Outcome(
            final.text,
            StopReason.ANSWER,
            f"plan finished after {replans} re-plans",
            messages + [final.to_message()],
        )
