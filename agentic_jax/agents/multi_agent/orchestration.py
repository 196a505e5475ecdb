"""Orchestrator-workers and hierarchical teams: centralised decomposition and synthesis.

An orchestrator splits the task into subtasks (a numbered list), hands each to a worker in turn
(a ``task`` message), collects their answers (``result`` messages) and writes the final answer
from them (the pattern of Anthropic's *Building effective agents*, 2024, with each worker an
agent rather than a single call).  With n subtasks and no failures a run sends exactly 2n
messages.

A worker may itself be an :class:`OrchestratorWorkers`: it receives a subtask as its task and
solves it with its own workers.  That is a hierarchy of teams (a team of teams, a lead per
team); every team in the tree sends its own task/result messages.

**Failures.**  Subtask i goes to the i-th available worker (round robin); if that worker fails
(and is excluded, see ``team.py``) the next available one retries it, until one succeeds or none
is left.  Subtasks nobody could do are reported to the orchestrator as failed, and it answers
from the rest; when no subtask succeeded the run stops with ``agents_failed``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gin

from agentic_jax.agents.loops.plan_execute import parse_plan
from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.tools.budget import Pricing, StopReason

DECOMPOSE = (
    "Task: {task}\n\nSplit the task into independent subtasks for your workers "
    "({workers}): a numbered list, one subtask per line, nothing else."
)
WORK = "Overall task: {task}\nYour subtask: {subtask}\n\nSolve the subtask; reply with its result."
SYNTHESIZE = (
    "Task: {task}\n\nResults of the subtasks:\n{results}\n\nCombine them into the "
    "answer to the task."
)
FAILED = "FAILED (no worker could do it)"


@gin.configurable(module="multi_agent")
class OrchestratorWorkers(Pattern):
    """``orchestrator`` leads ``workers`` (members or sub-teams); see the module docstring."""

    def __init__(
        self,
        orchestrator: TeamMember,
        workers: Sequence[TeamMember | OrchestratorWorkers],
        *,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        if not workers:
            raise ValueError("OrchestratorWorkers needs at least one worker")
        self.orchestrator, self.workers = orchestrator, list(workers)
        nested = any(isinstance(w, OrchestratorWorkers) for w in self.workers)
        self.name = "hierarchical_teams" if nested else "orchestrator_workers"

    @property
    def lead(self) -> str:
        return self.orchestrator.name

    def members(self) -> list[TeamMember]:
        out = [self.orchestrator]
        for w in self.workers:
            out += w.members() if isinstance(w, OrchestratorWorkers) else [w]
        return out

    def body(self, team: Team, task: str, artifacts: dict[str, Any]):
        team.next_round()
        answer = self.solve(team, task, artifacts)
        if answer is None:
            why = team.failures.get(self.lead)
            return (
                None,
                StopReason.AGENTS_FAILED,
                (
                    f"the orchestrator {self.lead} failed: {why.detail}"
                    if why is not None
                    else "no worker completed any subtask"
                ),
            )
        done = artifacts[self.lead]
        failed = sum(r["worker"] is None for r in done)
        return (
            answer,
            StopReason.ANSWER,
            (f"{self.lead} combined {len(done) - failed} of {len(done)} subtask results"),
        )

    # ------------------------------------------------------------------------------ the tree
    def available(self, team: Team) -> bool:
        """Can this team still take work: its lead and at least one worker are in."""
        return bool(team.available([self.lead])) and any(
            _unit_available(team, w) for w in self.workers
        )

    def solve(self, team: Team, task: str, artifacts: dict[str, Any]) -> str | None:
        """Decompose, delegate, synthesise; ``None`` if the lead failed or no subtask was done.
        Appends ``{subtask, worker, result}`` per subtask under the lead's name in ``artifacts``."""
        names = ", ".join(
            w.lead if isinstance(w, OrchestratorWorkers) else w.name for w in self.workers
        )
        plan = team.turn(self.lead, DECOMPOSE.format(task=task, workers=names))
        if plan is None:
            return None
        # A sub-team may solve several subtasks: each synthesis reads only this call's records.
        log, records = artifacts.setdefault(self.lead, []), []
        for i, subtask in enumerate(parse_plan(plan) or [task]):
            worker, result = self._delegate(team, task, subtask, i, artifacts)
            records.append({"subtask": subtask, "worker": worker, "result": result})
            log.append(records[-1])
        if all(r["worker"] is None for r in records):
            return None
        results = "\n".join(
            f"{i}. {r['subtask']}: {r['result'] if r['worker'] else FAILED}"
            for i, r in enumerate(records, 1)
        )
        return team.turn(self.lead, SYNTHESIZE.format(task=task, results=results))

    def _delegate(
        self, team: Team, task: str, subtask: str, index: int, artifacts: dict[str, Any]
    ) -> tuple[str | None, str | None]:
        """(worker, result) of the first available worker, from the ``index``-th on, that solves
        ``subtask``; ``(None, None)`` if none can."""
        units = [w for w in self.workers if _unit_available(team, w)]
        if not units:
            return None, None
        start = index % len(units)
        for unit in units[start:] + units[:start]:
            if not _unit_available(team, unit):
                continue
            name = unit.lead if isinstance(unit, OrchestratorWorkers) else unit.name
            team.send(self.lead, name, "task", subtask)
            if isinstance(unit, OrchestratorWorkers):
                result = unit.solve(team, subtask, artifacts)
            else:
                result = team.turn(name, WORK.format(task=task, subtask=subtask))
            if result is not None:
                team.send(name, self.lead, "result", result)
                return name, result
            team.decide(
                "retry", f"{name} could not do {subtask!r}; the next worker tries", subtask=subtask
            )
        team.decide("give_up", f"no worker could do {subtask!r}", subtask=subtask)
        return None, None


def _unit_available(team: Team, unit: TeamMember | OrchestratorWorkers) -> bool:
    if isinstance(unit, OrchestratorWorkers):
        return unit.available(team)
    return bool(team.available([unit.name]))
