"""What every multi-agent pattern shares: members, messages, budgets, accounting and termination.

A pattern (orchestrator-workers, debate, Contract-Net, ...) is a fixed protocol over
:class:`TeamMember`\\ s.  Each run gets a :class:`Team`, its runtime:

* **Turns.**  A member's turn is a ReAct loop (``react.py``) over its policy and tools on one
  prompt the pattern writes (the task and the messages addressed to the member); its answer is
  the turn's result.  Turns run one at a time in a fixed order, so a run is reproducible.
* **Budgets.**  Each member has its own :class:`Budget` over all its turns, and the team one
  over everyone's (``TeamLimits.budget``: model calls, tokens, cost, wall time): a model call
  starts only when both allow it.  Tokens come from the policies' :class:`Usage`.
* **Messages.**  Every message between members goes through :meth:`Team.send`, which logs it,
  traces it and counts it against ``TeamLimits.max_messages``.
* **Termination.**  Besides the budgets and the message limit, iterative patterns stop after
  ``max_rounds`` rounds, or after ``patience`` rounds in a row without progress (what progress
  means is the pattern's to say: a changed answer, a new board entry, a message in flight).
* **Failures.**  A turn that ends without an answer (the policy raised, the member's budget ran
  out, its tools kept failing until the loop gave up) is recorded as a :class:`Failure` and the
  member is excluded from the rest of the run; the pattern carries on without it (another worker
  retries the work, a vote counts the others), and stops with ``agents_failed`` only when no
  member is left for the work.  A team-wide limit instead stops the whole run.

Every run returns a :class:`TeamResult`: the answer, the stop reason and why, the message log,
per-agent and total counts, failures, and the trace events, which name the agent they belong
to (``agentic-jax trace show`` renders them).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import gin

from agentic_jax.agents.context.tracing import Tracer
from agentic_jax.agents.loops.agent import DATA_RULE, Outcome, Run
from agentic_jax.agents.loops.react import ReActAgent
from agentic_jax.agents.policies.base import Policy, Usage
from agentic_jax.agents.tools.base import Tool
from agentic_jax.agents.tools.budget import Budget, BudgetTracker, Pricing, StopReason

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


@gin.configurable(module="multi_agent")
@dataclasses.dataclass(frozen=True)
class TeamMember:
    """One agent of a team: a policy, the tools it may call, its role (said in its system prompt)
    and its own budget over all its turns.  ``name`` is how others address it."""

    name: str
    policy: Policy
    tools: Sequence[Tool] = ()
    role: str = ""
    budget: Budget = dataclasses.field(default_factory=Budget)
    sampling: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not NAME.match(self.name):
            raise ValueError(
                f"member name {self.name!r} must start with a letter and hold only "
                f"letters, digits, _ and -"
            )
        object.__setattr__(self, "tools", tuple(self.tools))

    @property
    def system_prompt(self) -> str:
        return " ".join(
            filter(None, [f"You are {self.name}, one agent of a team.", self.role, DATA_RULE])
        )


@gin.configurable(module="multi_agent")
@dataclasses.dataclass(frozen=True)
class TeamLimits:
    """Limits of one team run.  ``budget`` bounds the whole team (``max_steps`` counts every
    member's model calls); ``patience`` is the number of rounds in a row without progress after
    which an iterative pattern stops."""

    max_rounds: int = 5
    max_messages: int = 200
    budget: Budget = dataclasses.field(default_factory=lambda: Budget(max_steps=100))
    patience: int = 2

    def __post_init__(self):
        for field in ("max_rounds", "max_messages", "patience"):
            if getattr(self, field) < 1:
                raise ValueError(
                    f"TeamLimits.{field} must be at least 1, got {getattr(self, field)}"
                )


@dataclasses.dataclass(frozen=True)
class AgentMessage:
    """One message: ``act`` says what it does (task, result, answer, bid, award, post, ...)."""

    sender: str
    recipients: tuple[str, ...]
    act: str
    content: str
    round: int


class Failure(NamedTuple):
    """A member's turn that ended without an answer."""

    agent: str
    reason: StopReason
    detail: str
    round: int


@dataclasses.dataclass(frozen=True)
class AgentStats:
    turns: int
    model_calls: int
    usage: Usage
    cost: float
    sent: int  # messages
    received: int  # messages addressed to it (a broadcast counts once per recipient)
    failure: Failure | None


@dataclasses.dataclass(frozen=True)
class TeamResult:
    task: str
    pattern: str
    answer: str | None
    stop_reason: StopReason
    detail: str  # why it stopped, in words
    messages: tuple[AgentMessage, ...]
    rounds: int
    agents: Mapping[str, AgentStats]
    model_calls: int
    usage: Usage
    cost: float
    wall_s: float
    failures: tuple[Failure, ...]
    artifacts: Mapping[str, Any]  # what the pattern produced on the way (subtask results, bids)
    trace: tuple[dict, ...] = ()

    @property
    def ok(self) -> bool:
        return self.stop_reason is StopReason.ANSWER

    def count(self, act: str | None = None) -> int:
        """Messages sent (of one ``act``)."""
        return sum(act is None or m.act == act for m in self.messages)

    @property
    def deliveries(self) -> int:
        """Messages received, a broadcast once per recipient."""
        return sum(len(m.recipients) for m in self.messages)


class TeamStop(Exception):
    """A team-wide limit ended the run."""

    def __init__(self, reason: StopReason, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


class MemberTracker(BudgetTracker):
    """A member's spend, charged to the team's tracker too: a call starts only if both allow.

    Its wall time is that of its own turns: turns run one at a time, so the time since the team
    started would charge a member for everyone else's turns too."""

    def __init__(self, budget: Budget, pricing: Pricing, team: BudgetTracker):
        super().__init__(budget, pricing, team.clock)
        self.team = team
        self.spent_s, self.turn_start = 0.0, None

    @property
    def elapsed(self) -> float:
        running = 0.0 if self.turn_start is None else self.clock() - self.turn_start
        return self.spent_s + running

    @contextlib.contextmanager
    def timing(self):
        """Counts the wall time of one turn."""
        self.turn_start = self.clock()
        try:
            yield
        finally:
            self.spent_s += self.clock() - self.turn_start
            self.turn_start = None

    def charge(self, usage: Usage) -> None:
        super().charge(usage)
        self.team.charge(usage)

    def remaining_tokens(self) -> int | None:
        left = [
            r for r in (super().remaining_tokens(), self.team.remaining_tokens()) if r is not None
        ]
        return min(left) if left else None

    def exceeded(self) -> tuple[StopReason, str] | None:
        team = self.team.exceeded()
        return team if team is not None else super().exceeded()


def members_by_name(members: Iterable[TeamMember]) -> dict[str, TeamMember]:
    out = {}
    for m in members:
        if not isinstance(m, TeamMember):
            raise TypeError(f"team members must be TeamMember, got {type(m).__name__}")
        if m.name in out:
            raise ValueError(f"two team members are called {m.name!r}")
        out[m.name] = m
    if not out:
        raise ValueError("a team needs at least one member")
    return out


class Team:
    """The runtime of one pattern run (see the module docstring)."""

    def __init__(
        self,
        pattern: str,
        members: Iterable[TeamMember],
        limits: TeamLimits,
        pricing: Pricing | None = None,
        tracer: Tracer | None = None,
    ):
        self.pattern, self.limits, self.pricing = pattern, limits, pricing or Pricing()
        self.members = members_by_name(members)
        self.tracker = BudgetTracker(limits.budget, self.pricing)
        self.trackers = {
            name: MemberTracker(m.budget, self.pricing, self.tracker)
            for name, m in self.members.items()
        }
        self.tracer = tracer or Tracer(otel=False)
        self.log = self.tracer.scoped(agent=pattern)  # the pattern's own decisions
        self.messages: list[AgentMessage] = []
        self.failures: dict[str, Failure] = {}
        self.turns: collections.Counter[str] = collections.Counter()
        self.round = 0
        self.pending: TeamStop | None = None  # a stop raised where it could not propagate
        self._stalled = 0
        self._first_event = len(self.tracer.events)

    # -------------------------------------------------------------------------------- members
    def available(self, names: Iterable[str] | None = None) -> list[str]:
        """Members (of ``names``, in that order) not excluded by a failure."""
        return [n for n in (self.members if names is None else names) if n not in self.failures]

    def turn(self, name: str, prompt: str, tools: Sequence[Tool] = ()) -> str | None:
        """One turn of ``name`` on ``prompt`` (with ``tools`` besides its own): its answer, or
        ``None`` if it failed (recorded; the member is then excluded).  :class:`TeamStop` if a
        team-wide limit ended it."""
        self.check()
        member = self.members[name]
        if name in self.failures:
            raise ValueError(f"{name!r} is excluded after a failure")
        self.turns[name] += 1
        run = Run(self.trackers[name], self.tracer.scoped(agent=name))
        agent = ReActAgent(member.policy, [*member.tools, *tools], sampling=dict(member.sampling))
        try:
            with self.trackers[name].timing():
                outcome = agent.loop(run, prompt, system_prompt=member.system_prompt)
        except Exception as e:
            outcome = Outcome(None, StopReason.POLICY_ERROR, f"{type(e).__name__}: {e}", [])
        if outcome.reason is StopReason.ANSWER:
            return outcome.answer
        self.check()  # a team-wide limit, not the member, may have ended the turn
        failure = Failure(name, outcome.reason, outcome.detail, self.round)
        self.failures[name] = failure
        self.decide(
            "exclude",
            f"{name} failed ({outcome.reason.value}: {outcome.detail}) and takes no further part",
            agent_failed=name,
        )
        return None

    # ------------------------------------------------------------------------------- messages
    def send(
        self, sender: str, recipients: Sequence[str] | str, act: str, content: str
    ) -> AgentMessage:
        """Logs and traces one message; :class:`TeamStop` past ``max_messages``."""
        if len(self.messages) >= self.limits.max_messages:
            raise TeamStop(
                StopReason.MAX_MESSAGES, f"reached max_messages={self.limits.max_messages}"
            )
        recipients = (recipients,) if isinstance(recipients, str) else tuple(recipients)
        message = AgentMessage(sender, recipients, act, content, self.round)
        self.messages.append(message)
        self.tracer.message(self.round, sender, recipients, act, content)
        return message

    # ---------------------------------------------------------------------------- termination
    def check(self) -> None:
        """Raises the pending stop, or :class:`TeamStop` when a team budget is spent."""
        if self.pending is not None:
            raise self.pending
        exceeded = self.tracker.exceeded()
        if exceeded is not None:
            raise TeamStop(*exceeded)

    def next_round(self) -> bool:
        """Starts the next round; False (and no new round) when ``max_rounds`` are done."""
        if self.round >= self.limits.max_rounds:
            return False
        self.round += 1
        return True

    def progress(self, made: bool) -> bool:
        """Records whether this round made progress; True when ``patience`` rounds in a row made
        none (the pattern should stop with ``no_progress``)."""
        self._stalled = 0 if made else self._stalled + 1
        return self._stalled >= self.limits.patience

    def decide(self, decision: str, detail: str = "", **fields) -> None:
        self.log.decision(self.round, decision, detail, **fields)

    # ------------------------------------------------------------------------------- the run
    def start(self, task: str) -> None:
        self.tracer.emit("run_start", task=task, agent=self.pattern, members=list(self.members))

    def finish(
        self,
        task: str,
        answer: str | None,
        reason: StopReason,
        detail: str,
        artifacts: Mapping[str, Any] | None = None,
    ) -> TeamResult:
        t = self.tracker
        self.tracer.emit(
            "run_end",
            answer=answer,
            stop_reason=reason.value,
            detail=detail,
            steps=t.steps,
            total_tokens=t.usage.total_tokens,
            cost=t.cost,
            wall_s=t.elapsed,
            messages=len(self.messages),
            rounds=self.round,
        )
        received = collections.Counter(r for m in self.messages for r in m.recipients)
        sent = collections.Counter(m.sender for m in self.messages)
        agents = {
            name: AgentStats(
                self.turns[name],
                tr.steps,
                tr.usage,
                tr.cost,
                sent[name],
                received[name],
                self.failures.get(name),
            )
            for name, tr in self.trackers.items()
        }
        return TeamResult(
            task,
            self.pattern,
            answer,
            reason,
            detail,
            tuple(self.messages),
            self.round,
            agents,
            t.steps,
            t.usage,
            t.cost,
            t.elapsed,
            tuple(self.failures.values()),
            dict(artifacts or {}),
            tuple(self.tracer.events[self._first_event :]),
        )


class Pattern:
    """A multi-agent pattern: ``members()`` take part; ``body`` is the protocol, returning
    ``(answer, stop reason, detail)`` and filling ``artifacts`` as it goes."""

    name = "pattern"

    def __init__(self, *, limits: TeamLimits | None = None, pricing: Pricing | None = None):
        self.limits, self.pricing = limits or TeamLimits(), pricing or Pricing()

    def members(self) -> list[TeamMember]:
        raise NotImplementedError

    def body(
        self, team: Team, task: str, artifacts: dict[str, Any]
    ) -> tuple[str | None, StopReason, str]:
        raise NotImplementedError

    def run(self, task: str, *, tracer: Tracer | None = None) -> TeamResult:
        """One run on ``task``; a team-wide stop ends it with that reason, keeping the artifacts
        made so far."""
        team = Team(self.name, self.members(), self.limits, self.pricing, tracer)
        team.start(task)
        artifacts: dict[str, Any] = {}
        try:
            answer, reason, detail = self.body(team, task, artifacts)
        except TeamStop as stop:
            team.decide("stop", stop.detail, reason=stop.reason.value)
            answer, reason, detail = None, stop.reason, stop.detail
        return team.finish(task, answer, reason, detail, artifacts)


def inbox(messages: Iterable[AgentMessage]) -> str:
    """Messages as the text a member reads."""
    return "\n\n".join(f"From {m.sender} ({m.act}): {m.content}" for m in messages)
