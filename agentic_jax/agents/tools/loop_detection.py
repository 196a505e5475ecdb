"""Loop detection: an agent calling the same tool with the same arguments, or making no progress.

Small models (and large ones) get stuck re-issuing a call whose answer they already have.  The
detector first *redirects*: the repeated call is not run, and the model is told why and what to do
instead (use the earlier result, try another approach, or answer).  Only when it persists does the
run stop, with :data:`StopReason.REPEATED_CALL` or :data:`StopReason.NO_PROGRESS`.

A call *repeats* an earlier identical call only if no tool result seen since that call was new:
re-reading a file after a write (whose result was new) runs, re-reading it with nothing new in
between does not.  A loop of several calls is caught on its second lap, when none of its results
is new any more.  A step makes no progress when every tool result it got was an error or had been
seen before.
"""

from __future__ import annotations

import dataclasses
import json
from typing import NamedTuple

from agentic_jax.agents.tools.budget import StopReason
from agentic_jax.data.chat import ToolCall

CONTINUE, REDIRECT, STOP = "continue", "redirect", "stop"


class Verdict(NamedTuple):
    action: str  # CONTINUE, REDIRECT or STOP
    reason: StopReason | None = None
    message: str = ""


def _canonical(value):
    """``1.0`` as ``1``, so that arguments equal in value make one key (JSON writes them apart);
    a bool stays a bool."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    return value


def call_key(call: ToolCall) -> str:
    return json.dumps([call.name, _canonical(call.arguments)], sort_keys=True, default=str)


@dataclasses.dataclass
class LoopDetector:
    """``max_repeats``: identical calls allowed before a redirect; ``patience``: steps without
    progress before a redirect; ``redirects``: redirects before stopping."""

    max_repeats: int = 1
    patience: int = 3
    redirects: int = 1

    def __post_init__(self):
        self._calls: dict[str, tuple[int, int]] = {}  # key -> (repeats, news when last run)
        self._pending: list[str] = []  # keys checked since the last step, in call order
        self._news = 0  # new successful results so far
        self._results: set[str] = set()
        self._stalled = 0
        self._redirected = 0

    def _escalate(self, reason: StopReason, message: str) -> Verdict:
        if self._redirected >= self.redirects:
            return Verdict(STOP, reason, message)
        self._redirected += 1
        return Verdict(REDIRECT, reason, message)

    def check_call(self, call: ToolCall) -> Verdict:
        """Before running ``call``."""
        key = call_key(call)
        count, news_then = self._calls.get(key, (0, self._news))
        count = count + 1 if news_then == self._news else 1  # something new since: not a loop
        self._calls[key] = (count, self._news)
        self._pending.append(key)
        if count <= self.max_repeats:
            return Verdict(CONTINUE)
        return self._escalate(
            StopReason.REPEATED_CALL,
            f"repeated call: {call.name} was already called with these "
            f"arguments {count - 1} time(s) and nothing new has come back "
            f"since; use the earlier result, try a different approach, or "
            f"give the final answer",
        )

    def check_step(self, results: list[tuple[bool, str]]) -> Verdict:
        """After a step's tool results ``(ok, content)``: one per call checked since the last
        step, in the same order (a redirected call's result is ``(False, message)``)."""
        if len(results) != len(self._pending):
            raise ValueError(
                f"check_step got {len(results)} results for {len(self._pending)} checked calls"
            )
        progress = False
        for key, (ok, content) in zip(self._pending, results):
            if ok and content not in self._results:
                self._news += 1
                progress = True
            self._results.add(content)
            self._calls[key] = (self._calls[key][0], self._news)  # its own result is no news
        self._pending.clear()
        self._stalled = 0 if progress else self._stalled + 1
        if self._stalled < self.patience:
            return Verdict(CONTINUE)
        self._stalled = 0
        return self._escalate(
            StopReason.NO_PROGRESS,
            f"no progress: the last {self.patience} steps brought no new tool "
            f"results; change approach or give the final answer",
        )
