"""Reflexion (Shinn et al. 2023, *Reflexion: Language Agents with Verbal Reinforcement Learning*).

After a failed attempt the model writes a self-critique (what went wrong, what to do differently),
which is stored in a :class:`ReflectionMemory` and shown in the system prompt of every later
attempt: learning from trial and error in words rather than in weights.  An evaluator (unit
tests, an exact-match check, a reward model) decides success.  The memory can live in a JSON file,
so reflections also carry over between runs of the same task.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from agentic_jax.agents.context.tracing import Tracer
from agentic_jax.agents.loops.agent import (
    BUDGET_STOPS,
    AgentResult,
    BudgetExceeded,
    Evaluation,
    Outcome,
    Run,
)
from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import PolicyError
from agentic_jax.agents.tools.budget import Budget, BudgetTracker, Pricing, StopReason
from agentic_jax.data.chat import Message
from agentic_jax.files import atomic_write

Evaluator = Callable[[str, str | None], Evaluation]
REFLECT_PROMPT = (
    "You failed a task. In two or three sentences, diagnose why and state concretely "
    "what you will do differently next time. Do not solve the task."
)


class ReflectionMemory:
    """Reflections per task, newest last; at most ``max_per_task`` kept.  With ``path`` they are
    read from and written to a JSON file.  Each :meth:`add` re-reads the file first, so memories
    of other runs on the same file keep what they wrote, and replaces it atomically
    (:func:`~agentic_jax.files.atomic_write`), so a crash mid-write cannot leave it half-written."""

    def __init__(self, path: str | Path | None = None, max_per_task: int = 3):
        if max_per_task < 1:
            raise ValueError(f"max_per_task={max_per_task} must be at least 1")
        self.path, self.max_per_task = None if path is None else Path(path), max_per_task
        self._store: dict[str, list[str]] = self._read()

    def _read(self) -> dict[str, list[str]]:
        if self.path is None or not self.path.exists():
            return {}
        return json.loads(self.path.read_text(encoding="utf-8"))

    def get(self, task: str) -> list[str]:
        return list(self._store.get(task, []))

    def add(self, task: str, reflection: str) -> None:
        if self.path is not None:
            self._store = self._read()
        self._store[task] = (self.get(task) + [reflection])[-self.max_per_task :]
        if self.path is not None:
            with atomic_write(self.path, encoding="utf-8") as f:
                f.write(json.dumps(self._store, indent=1))


class Reflexion:
    """Attempts ``task`` with ``actor`` (a :class:`ReActAgent`) until ``evaluator`` accepts the
    answer or ``max_attempts`` pass; all attempts share one budget and trace."""

    def __init__(
        self,
        actor: ReActAgent,
        evaluator: Evaluator,
        *,
        memory: ReflectionMemory | None = None,
        max_attempts: int = 3,
        budget: Budget = Budget(max_steps=30),
        pricing: Pricing = Pricing(),
        tracer: Tracer | None = None,
    ):
        self.actor, self.evaluator, self.max_attempts = actor, evaluator, max_attempts
        self.memory = memory if memory is not None else ReflectionMemory()
        self.budget, self.pricing, self.tracer = budget, pricing, tracer

    def run(self, task: str) -> AgentResult:
        run = Run(BudgetTracker(self.budget, self.pricing), self.tracer)
        run.start(task, "reflexion")
        return run.finish(task, self._run(run, task))

    def _system_prompt(self, task: str) -> str:
        reflections = self.memory.get(task)
        if not reflections:
            return self.actor.system_prompt
        return (
            self.actor.system_prompt
            + "\n\n# Lessons from your earlier attempts\n"
            + "\n".join(f"- {r}" for r in reflections)
        )

    def _run(self, run: Run, task: str) -> Outcome:
        messages: list[Message] = []
        for attempt in range(1, self.max_attempts + 1):
            sub = self.actor.loop(run, task, system_prompt=self._system_prompt(task))
            messages += sub.messages
            if sub.reason in BUDGET_STOPS:
                return Outcome(None, sub.reason, sub.detail, messages)
            verdict = self.evaluator(task, sub.answer)
            run.decide(
                "evaluate",
                f"attempt {attempt}: "
                + ("success" if verdict.success else f"failed: {verdict.feedback}"),
            )
            if verdict.success:
                return Outcome(
                    sub.answer,
                    StopReason.ANSWER,
                    f"the evaluator accepted attempt {attempt}",
                    messages,
                )
            if attempt == self.max_attempts:
                break
            transcript = "\n".join(
                f"{m.role}: {m.content}"
                + "".join(f" [called {c.name}({c.arguments})]" for c in m.tool_calls)
                for m in sub.messages
            )
            try:
                reply = run.model(
                    self.actor.policy,
                    [
                        Message("system", REFLECT_PROMPT),
                        Message(
                            "user",
                            f"Task: {task}\nYour attempt:\n{transcript}\n"
                            f"Evaluator feedback: {verdict.feedback or 'wrong answer'}",
                        ),
                    ],
                )
            except BudgetExceeded as e:
                return Outcome(None, e.reason, e.detail, messages)
            except PolicyError as e:
                return Outcome(None, StopReason.POLICY_ERROR, str(e), messages)
            self.memory.add(task, reply.text.strip())
            run.decide("reflect", reply.text.strip())
        return Outcome(
            None,
            StopReason.MAX_ATTEMPTS,
            f"the evaluator rejected all {self.max_attempts} attempts",
            messages,
        )
