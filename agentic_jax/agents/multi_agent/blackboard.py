"""The blackboard: agents work on a shared board, and a controller picks who acts next.

The blackboard architecture (Erman et al. 1980, *The Hearsay-II Speech-Understanding System*;
Nii 1986, *Blackboard Systems*) has independent knowledge sources that read a shared board and
post to it, and a control component that decides, from the board, which of them acts next.
Here each round the controller names one member (or ``FINISH``); that member reads the task and
the whole board and posts one entry (a ``post`` message).  ``FINISH`` makes the latest entry
the answer.

The controller is a :class:`TeamMember` (asked for a name; the first word of its reply that is a
member's name or ``FINISH``, in any case, is its choice) or a function ``(task, board, names)
-> name or FINISH``.  A round makes no progress when the choice is invalid (an unknown or
excluded member, or ``FINISH`` on an empty board), the chosen member fails, or its post repeats
an entry already on the board; ``patience`` such rounds in a row stop the run (``no_progress``).

:class:`ConfidenceBoard` is the keyed form of the board that knowledge sources share outside a
pattern run: each key holds one entry with its author and confidence.  A write is
**confidence-gated**: it must reach ``min_confidence``, and it replaces the current entry only
with a strictly higher confidence, or with one at or above ``overwrite_at`` (so a sure
correction can displace an overconfident guess).  Subscribers of a key are called on every
accepted write to it (the "demons" of blackboard systems, Nii 1986), with the old and the new
entry.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gin

from agentic_jax.agents.multi_agent.team import Pattern, Team, TeamLimits, TeamMember
from agentic_jax.agents.multi_agent.voting import normalize
from agentic_jax.agents.tools.budget import Pricing, StopReason

FINISH = "FINISH"
BOARD = "blackboard"
WORK_PROMPT = (
    "Team task: {task}\n\nThe blackboard so far:\n{board}\n\nAdd your contribution: "
    "reply with one entry for the board."
)
CONTROL_PROMPT = (
    "Team task: {task}\n\nThe blackboard so far:\n{board}\n\nWho should act next? "
    "Agents: {names}. Reply with one name, or FINISH if the latest entry answers "
    "the task."
)


class Entry(NamedTuple):
    author: str
    content: str
    round: int


Controller = Callable[[str, Sequence[Entry], Sequence[str]], str]


def render_board(board: Sequence[Entry]) -> str:
    return "\n".join(f"[{i}] {e.author}: {e.content}" for i, e in enumerate(board, 1)) or "(empty)"


def parse_choice(reply: str, names: Sequence[str]) -> str | None:
    """The first word of ``reply`` that is one of ``names`` or FINISH (any case), else None."""
    lookup = {n.casefold(): n for n in [*names, FINISH]}
    for word in re.findall(r"[A-Za-z][A-Za-z0-9_-]*", reply):
        if word.casefold() in lookup:
            return lookup[word.casefold()]
    return None


@gin.configurable(module="multi_agent")
class Blackboard(Pattern):
    """``experts`` post to a shared board in the order ``controller`` decides."""

    name = "blackboard"

    def __init__(
        self,
        experts: Sequence[TeamMember],
        controller: TeamMember | Controller,
        *,
        limits: TeamLimits | None = None,
        pricing: Pricing | None = None,
    ):
        super().__init__(limits=limits, pricing=pricing)
        self.experts, self.controller = list(experts), controller

    def members(self) -> list[TeamMember]:
        chooser = [self.controller] if isinstance(self.controller, TeamMember) else []
        return [*self.experts, *chooser]

    def _choose(self, team: Team, task: str, board: list[Entry]) -> str | None:
        names = team.available([e.name for e in self.experts])
        if not isinstance(self.controller, TeamMember):
            return self.controller(task, tuple(board), names)
        reply = team.turn(
            self.controller.name,
            CONTROL_PROMPT.format(task=task, board=render_board(board), names=", ".join(names)),
        )
        return None if reply is None else parse_choice(reply, names)

    def body(self, team: Team, task: str, artifacts: dict[str, Any]):
        board: list[Entry] = []
        artifacts["board"] = board
        experts = [e.name for e in self.experts]
        while team.next_round():
            if not team.available(experts):
                return None, StopReason.AGENTS_FAILED, "every expert failed"
            choice = self._choose(team, task, board)
            if isinstance(self.controller, TeamMember) and self.controller.name in team.failures:
                return None, StopReason.AGENTS_FAILED, "the controller failed"
            if choice == FINISH and board:
                team.decide("finish", f"the controller finished after {len(board)} entries")
                return (
                    board[-1].content,
                    StopReason.ANSWER,
                    (f"the controller accepted {board[-1].author}'s entry"),
                )
            progress = False
            if choice in team.available(experts):
                team.decide("next", f"{choice} acts", chosen=choice)
                reply = team.turn(choice, WORK_PROMPT.format(task=task, board=render_board(board)))
                if reply is not None:
                    progress = normalize(reply) not in {normalize(e.content) for e in board}
                    team.send(choice, BOARD, "post", reply)
                    board.append(Entry(choice, reply, team.round))
            else:
                team.decide(
                    "invalid_choice",
                    f"the controller chose {choice!r}; experts: "
                    f"{', '.join(team.available(experts))}",
                )
            if team.progress(progress):
                return (
                    None,
                    StopReason.NO_PROGRESS,
                    (f"{team.limits.patience} rounds in a row added nothing new to the board"),
                )
        return (
            None,
            StopReason.MAX_ROUNDS,
            (f"the controller did not finish within max_rounds={team.limits.max_rounds}"),
        )


class Posting(NamedTuple):
    value: str
    author: str
    confidence: float
    version: int  # accepted writes to the key so far, this one included


Subscriber = Callable[[str, Posting | None, Posting], None]  # (key, old, new)


def _unit_interval(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)


@gin.configurable(module="multi_agent")
class ConfidenceBoard:
    """A keyed blackboard with confidence-gated writes and key subscriptions; see the module
    docstring.  Safe to write from several threads."""

    def __init__(self, *, min_confidence: float = 0.0, overwrite_at: float | None = None):
        self.min_confidence = _unit_interval("min_confidence", min_confidence)
        self.overwrite_at = (
            None if overwrite_at is None else _unit_interval("overwrite_at", overwrite_at)
        )
        self._entries: dict[str, Posting] = {}
        self._subscribers: dict[str, list[Subscriber]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Posting | None:
        with self._lock:
            return self._entries.get(key)

    def entries(self) -> dict[str, Posting]:
        with self._lock:
            return dict(self._entries)

    def accepts(self, key: str, confidence: float) -> bool:
        """Would a write of ``confidence`` to ``key`` pass the gate now."""
        with self._lock:
            return self._admits(self._entries.get(key), confidence)

    def _admits(self, current: Posting | None, confidence: float) -> bool:
        if confidence < self.min_confidence:
            return False
        if current is None or confidence > current.confidence:
            return True
        return self.overwrite_at is not None and confidence >= self.overwrite_at

    def write(self, key: str, value: str, author: str, confidence: float) -> bool:
        """Posts ``value`` under ``key`` if the gate lets it through (True), then calls the key's
        subscribers in the order they subscribed.  If some raise, the write still stands and an
        :class:`ExceptionGroup` of their errors is raised after all were called."""
        confidence = _unit_interval("confidence", confidence)
        with self._lock:
            old = self._entries.get(key)
            if not self._admits(old, confidence):
                return False
            new = Posting(value, author, confidence, 1 + (old.version if old else 0))
            self._entries[key] = new
            subscribers = list(self._subscribers.get(key, ()))
        errors = []
        for subscriber in subscribers:
            try:
                subscriber(key, old, new)
            except Exception as e:
                errors.append(e)
        if errors:
            raise ExceptionGroup(f"{len(errors)} subscribers of {key!r} failed", errors)
        return True

    def subscribe(self, key: str, subscriber: Subscriber) -> Callable[[], None]:
        """Calls ``subscriber(key, old, new)`` on every accepted write to ``key``; returns the
        function that cancels the subscription."""
        with self._lock:
            self._subscribers.setdefault(key, []).append(subscriber)

        def cancel() -> None:
            with self._lock:
                self._subscribers[key].remove(subscriber)

        return cancel
