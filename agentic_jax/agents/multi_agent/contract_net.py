"""Contract-Net task allocation: announce, bid, award to the best bid, execute, report.

Smith 1980, *The Contract Net Protocol: High-Level Communication and Control in a Distributed
Problem Solver* (IEEE Transactions on Computers C-29(12)).  A manager has tasks; for each it
broadcasts an announcement to the contractors (one ``announce`` message to n recipients), each
contractor replies with a bid (``BID: <cost>``, or ``NO BID``), the manager awards the task to
the best bid (``award``), and the winner does the task and sends back its result (``report``).
With m tasks and n contractors and no failures: m announcements, n·m bids, m awards, m reports.

**Best bid (deterministic).**  The lowest cost wins; equal costs go to the contractor listed
first.  A reply without a parsable bid is a refusal.  If the winner fails to do the task, the
next best bidder still in the team gets it (another award); a task nobody could do is reported
as unallocated.

The tasks are given (``subtasks``), or split from the task by the ``manager`` (a
:class:`TeamMember`, which then also writes the final answer from the reports); with neither,
the task itself is the one task.  Without a manager the pattern announces and awards as
``(manager)``, a name no member can have (so no contractor is credited with its messages), and
the answer lists the reports.  All bids are collected before the first award, so a contractor's
bid never depends on what it has won.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import gin

from agentic_jax.agents.loops.plan_execute import parse_plan
from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.tools.budget import Pricing, StopReason

MANAGER = "(manager)"
ANNOUNCE_PROMPT = (
    "Call for bids. Task: {task}\n\nIf you can do it, reply 'BID: <your estimated "
    "cost>' (a number; the lowest bid wins). Otherwise reply 'NO BID'."
)
EXECUTE_PROMPT = "You won the contract for this task: {task}\n\nDo it and reply with the result."
SPLIT_PROMPT = (
    "Task: {task}\n\nSplit the task into independent subtasks to put out to tender: "
    "a numbered list, one per line, nothing else."
)
COMBINE_PROMPT = "Task: {task}\n\nThe contractors' reports:\n{reports}\n\nWrite the answer."

_BID = re.compile(r"(?i)\bbid\s*[:=]\s*([-+]?\d*\.?\d+(?:e[-+]?\d+)?)")
_NO_BID = re.compile(r"(?i)\bno\s+bid\b")


class Bid(NamedTuple):
    contractor: str
    task: int
    cost: float | None  # None: no bid


def parse_bid(reply: str) -> float | None:
    """The cost in ``BID: <number>``; None for ``NO BID``, a missing or a non-finite number."""
    if _NO_BID.search(reply):
        return None
    match = _BID.search(reply)
    cost = float(match.group(1)) if match else math.nan
    return cost if math.isfinite(cost) else None


def rank_bids(bids: Sequence[Bid], order: Sequence[str]) -> list[Bid]:
    """Valid bids best first: lowest cost, then the contractor's place in ``order``."""
    place = {name: i for i, name in enumerate(order)}
    return sorted(
        (b for b in bids if b.cost is not None), key=lambda b: (b.cost, place[b.contractor])
    )


@gin.configurable(module="multi_agent")
class ContractNet(Pattern):
    """Tasks allocated to ``contractors`` by bidding; see the module docstring."""

    name = "contract_net"

    def __init__(
        self,
        contractors: Sequence[TeamMember],
        *,
        manager: TeamMember | None = None,
        subtasks: Sequence[str] | None = None,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        if not contractors:
            raise ValueError("ContractNet needs at least one contractor")
        self.contractors, self.manager = list(contractors), manager
        self.subtasks = None if subtasks is None else list(subtasks)

    def members(self) -> list[TeamMember]:
        return [*([self.manager] if self.manager else []), *self.contractors]

    def _tasks(self, team: Team, task: str) -> list[str] | None:
        if self.subtasks is not None:
            return self.subtasks
        if self.manager is None:
            return [task]
        plan = team.turn(self.manager.name, SPLIT_PROMPT.format(task=task))
        return None if plan is None else parse_plan(plan) or [task]

    def body(self, team: Team, task: str, artifacts: dict[str, Any]):
        team.next_round()
        manager = self.manager.name if self.manager else MANAGER
        contractors = [c.name for c in self.contractors]
        tasks = self._tasks(team, task)
        if tasks is None:
            return None, StopReason.AGENTS_FAILED, "the manager failed to split the task"
        bids: list[Bid] = artifacts.setdefault("bids", [])
        for i, subtask in enumerate(tasks):
            bidders = team.available(contractors)
            team.send(manager, bidders, "announce", subtask)
            for name in bidders:
                reply = team.turn(name, ANNOUNCE_PROMPT.format(task=subtask))
                if reply is not None:
                    team.send(name, manager, "bid", reply)
                    bids.append(Bid(name, i, parse_bid(reply)))
        awards: dict[int, str] = artifacts.setdefault("awards", {})
        reports: dict[int, str] = artifacts.setdefault("reports", {})
        for i, subtask in enumerate(tasks):
            for bid in rank_bids([b for b in bids if b.task == i], contractors):
                if not team.available([bid.contractor]):
                    continue
                team.send(manager, bid.contractor, "award", subtask)
                awards[i] = bid.contractor
                result = team.turn(bid.contractor, EXECUTE_PROMPT.format(task=subtask))
                if result is not None:
                    team.send(bid.contractor, manager, "report", result)
                    reports[i] = result
                    break
                team.decide("reaward", f"{bid.contractor} failed task {i + 1}; next best bid")
            if i not in reports:
                awards.pop(i, None)
                team.decide("unallocated", f"no contractor could do task {i + 1}: {subtask!r}")
        if not reports:
            return None, StopReason.AGENTS_FAILED, "no task was done"
        lines = "\n".join(
            f"{i + 1}. {t}: {reports.get(i, 'UNALLOCATED')}" for i, t in enumerate(tasks)
        )
        detail = f"{len(reports)} of {len(tasks)} tasks done"
        if self.manager is None:
            return lines, StopReason.ANSWER, detail
        answer = team.turn(manager, COMBINE_PROMPT.format(task=task, reports=lines))
        if answer is None:
            return None, StopReason.AGENTS_FAILED, "the manager failed to combine the reports"
        return answer, StopReason.ANSWER, detail
