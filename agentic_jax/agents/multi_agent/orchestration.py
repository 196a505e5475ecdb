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

**A plan with dependencies.**  Given a ``plan`` (a :class:`~.task_dag.TaskDAG`), the
orchestrator does not decompose: it runs the plan's tasks in their waves (``task_dag.py``), each
task's worker reading the results of the tasks it runs after, then synthesises as before.  A
task nobody could do blocks the tasks that need it; the others still run.  A wave's tasks go to
their workers one after another, in the plan's order: the team's accounting (``team.py``) is
kept by one thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gin

from agentic_jax.agents.loops.plan_execute import parse_plan
from agentic_jax.agents.multi_agent.task_dag import BLOCKED, DONE, Task, TaskDAG, run_dag
from agentic_jax.agents.multi_agent.task_dag import FAILED as FAILED_STATUS
from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember, TeamStop
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
INPUTS = "{prompt}\n\nResults of the tasks it builds on:\n{inputs}"
FAILED = "FAILED (no worker could do it)"
NOT_RUN = "NOT RUN (a task it needs was not done)"
Record = Callable[..., None]  # (subtask, worker, result, **fields): logs one subtask's outcome


@gin.configurable(module="multi_agent")
class OrchestratorWorkers(Pattern):
    """``orchestrator`` leads ``workers`` (members or sub-teams), splitting the task itself or
    following ``plan``; see the module docstring."""

    def __init__(
        self,
        orchestrator: TeamMember,
        workers: Sequence[TeamMember | OrchestratorWorkers],
        *,
        plan: TaskDAG | None = None,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        if not workers:
            raise ValueError("OrchestratorWorkers needs at least one worker")
        self.orchestrator, self.workers, self.plan = orchestrator, list(workers), plan
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
        """Decompose (or follow the plan), delegate, synthesise; ``None`` if the lead failed or
        no subtask was done.  Appends ``{subtask, worker, result}`` per subtask (with its
        ``status`` and ``wave`` under a plan) under the lead's name in ``artifacts`` as it goes."""
        # A sub-team may solve several subtasks: each synthesis reads only this call's records.
        log, records = artifacts.setdefault(self.lead, []), []

        def record(subtask: str, worker: str | None, result: str | None, **fields) -> None:
            records.append({"subtask": subtask, "worker": worker, "result": result, **fields})
            log.append(records[-1])

        if self.plan is not None:
            self._follow(self.plan, team, task, artifacts, record)
        elif not self._split(team, task, artifacts, record):
            return None
        if all(r["worker"] is None for r in records):
            return None
        results = "\n".join(
            f"{i}. {r['subtask']}: "
            + (r["result"] if r["worker"] else NOT_RUN if r.get("status") == BLOCKED else FAILED)
            for i, r in enumerate(records, 1)
        )
        return team.turn(self.lead, SYNTHESIZE.format(task=task, results=results))

    def _split(self, team: Team, task: str, artifacts: dict[str, Any], record: Record) -> bool:
        """The lead's own decomposition, delegated subtask by subtask; False if the lead failed."""
        names = ", ".join(
            w.lead if isinstance(w, OrchestratorWorkers) else w.name for w in self.workers
        )
        plan = team.turn(self.lead, DECOMPOSE.format(task=task, workers=names))
        if plan is None:
            return False
        for i, subtask in enumerate(parse_plan(plan) or [task]):
            record(subtask, *self._delegate(team, task, subtask, i, artifacts))
        return True

    def _follow(
        self, plan: TaskDAG, team: Team, task: str, artifacts: dict[str, Any], record: Record
    ) -> None:
        """``plan``'s tasks in waves, recorded as they finish, then the blocked ones; the i-th
        task in topological order starts the round robin at the i-th worker, as the i-th subtask
        of a split does."""
        place = {name: i for i, name in enumerate(plan.order)}

        def work(step: Task, inputs: dict[str, str]) -> str | None:
            prompt = step.prompt
            if inputs:
                done = "\n".join(f"- {name}: {result}" for name, result in inputs.items())
                prompt = INPUTS.format(prompt=step.prompt, inputs=done)
            worker, result = self._delegate(team, task, prompt, place[step.name], artifacts)
            status = FAILED_STATUS if result is None else DONE
            record(step.prompt, worker, result, status=status, wave=plan.levels[step.name])
            return result

        run = run_dag(plan, work, max_workers=1, abort_on=(TeamStop,))
        for name, status in run.status.items():
            if status == BLOCKED:
                team.decide("blocked", f"{name} {run.errors[name]}", subtask=name)
                record(plan.tasks[name].prompt, None, None, status=status, wave=plan.levels[name])

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
