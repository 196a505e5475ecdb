"""Running tool calls: validation, allow-lists, approval gates, timeouts, retries, circuit breakers.

Whatever goes wrong with a call becomes a :class:`ToolResult` whose content tells the model what
happened (``error: ...``), never an exception in the agent loop: a model can recover from "invalid
arguments" or "tool unavailable", a crashed loop cannot.

* **Allow-list and approval gate.**  Only allowed tools are advertised or run.  Each tool has an
  approval tier: ``auto`` runs it, ``ask`` needs ``approver(tool, call)`` to say yes (no
  approver: always no), ``deny`` never runs it.  ``approval`` maps tool names to tiers; a tool
  it does not name asks when it is marked ``dangerous`` and runs otherwise.
* **Timeouts.**  Each attempt runs in a daemon thread bounded by the tool's ``timeout_s``.  Python
  cannot kill a thread, so a hung call keeps its thread (a daemon, so it cannot keep the process
  alive); code that may hang for real belongs in the subprocess sandbox (``sandbox.py``), which
  is killed.
* **Retries** of transient failures (:class:`TransientToolError`, ``TimeoutError``,
  ``ConnectionError``) with exponential backoff and full jitter: attempt ``k`` waits
  ``uniform(0, min(max_delay, base_delay * 2**k))`` (the AWS Architecture Blog's "Exponential
  Backoff and Jitter"), which spreads retries of many clients apart.
* **Graceful degradation.**  After ``failure_threshold`` failed calls in a row a tool's circuit
  opens for ``cooldown_s``: it is no longer advertised, and calls to it return at once with a
  message telling the model to carry on without it.  A :class:`ToolError` (the tool refusing on
  purpose, e.g. "not compacted") is an answer, not a failure: it never opens the circuit.
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import gin

from agentic_jax.agents.tools.base import (
    Tool,
    ToolArgumentError,
    ToolError,
    TransientToolError,
    to_text,
)
from agentic_jax.data.chat import Message, ToolCall, as_data

Approver = Callable[[Tool, ToolCall], bool]
APPROVAL_TIERS = ("auto", "ask", "deny")
TRANSIENT = (TransientToolError, TimeoutError, ConnectionError)


@gin.configurable(module="agents")
@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0

    def delay(self, attempt: int, rng: random.Random) -> float:
        """Full-jitter backoff before retry number ``attempt`` (0-based)."""
        return rng.uniform(0.0, min(self.max_delay_s, self.base_delay_s * 2**attempt))


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """The outcome of one call.  ``status``: ok, invalid_arguments, unknown_tool, denied,
    unavailable, timeout or failed."""

    call: ToolCall
    content: str
    status: str = "ok"
    attempts: int = 0
    latency_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def message(self) -> Message:
        return Message("tool", self.content)


class _Hung(Exception):
    pass


def _call_with_timeout(fn: Callable, kwargs: dict, timeout_s: float | None):
    """``fn(**kwargs)`` in a daemon thread; :class:`_Hung` if it outlives ``timeout_s``."""
    box = {}

    def target():
        try:
            box["value"] = fn(**kwargs)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=target, name="tool", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Hung
    if "error" in box:
        raise box["error"]
    return box["value"]


class _Circuit:
    def __init__(self):
        self.failures = 0
        self.open_until = float("-inf")


class ToolExecutor:
    """Runs calls against ``tools``; see the module docstring."""

    def __init__(
        self,
        tools: Iterable[Tool],
        *,
        allow: Iterable[str] | None = None,
        approver: Approver | None = None,
        approval: Mapping[str, str] | None = None,
        retry: RetryPolicy = RetryPolicy(),
        failure_threshold: int = 3,
        cooldown_s: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ):
        self.tools = {t.name: t for t in tools}
        self.allow = None if allow is None else set(allow)
        self.approver, self.retry = approver, retry
        self.approval = dict(approval or {})
        for name, tier in self.approval.items():
            if tier not in APPROVAL_TIERS:
                raise ValueError(
                    f"approval tier {tier!r} of tool {name!r}; expected one of {APPROVAL_TIERS}"
                )
        self.failure_threshold, self.cooldown_s = failure_threshold, cooldown_s
        self.sleep, self.clock, self.rng = sleep, clock, random.Random(seed)
        self._circuits = {name: _Circuit() for name in self.tools}

    def allowed(self, name: str) -> bool:
        return name in self.tools and (self.allow is None or name in self.allow)

    def approval_tier(self, tool: Tool) -> str:
        return self.approval.get(tool.name, "ask" if tool.dangerous else "auto")

    def is_down(self, name: str) -> bool:
        return self.clock() < self._circuits[name].open_until

    def available(self) -> list[Tool]:
        """The tools to advertise now: allowed and not cut off by an open circuit."""
        return [
            t for name, t in self.tools.items() if self.allowed(name) and not self.is_down(name)
        ]

    def execute(self, call: ToolCall) -> ToolResult:
        start = self.clock()
        status, content, attempts = self._execute(call)
        return ToolResult(call, as_data(content), status, attempts, self.clock() - start)

    def _execute(self, call: ToolCall) -> tuple[str, str, int]:
        if call.name not in self.tools:
            names = ", ".join(t.name for t in self.available()) or "none"
            return "unknown_tool", f"error: unknown tool {call.name!r} (available: {names})", 0
        tool = self.tools[call.name]
        if not self.allowed(call.name):
            return "denied", f"error: tool {call.name!r} is not on the allow-list", 0
        if self.is_down(call.name):
            return (
                "unavailable",
                (f"error: tool {call.name!r} is unavailable right now; continue without it"),
                0,
            )
        try:
            kwargs = tool.validate(call.arguments)
        except ToolArgumentError as e:
            return "invalid_arguments", f"error: {e}", 0
        tier = self.approval_tier(tool)
        if tier == "deny":
            return "denied", f"error: tool {call.name!r} may not be used here", 0
        if tier == "ask" and not (self.approver is not None and self.approver(tool, call)):
            return "denied", f"error: the call to {call.name!r} was not approved", 0
        status, content, attempts, answered = self._with_retries(tool, kwargs)
        self._record(call.name, answered)
        return status, content, attempts

    def _with_retries(self, tool: Tool, kwargs: dict) -> tuple[str, str, int, bool]:
        """(status, content, attempts, whether the tool answered: with a value or a refusal)."""
        for attempt in range(self.retry.max_attempts):
            try:
                value = _call_with_timeout(tool.fn, kwargs, tool.timeout_s)
                return "ok", to_text(value), attempt + 1, True
            except _Hung:
                status, error = "timeout", f"timed out after {tool.timeout_s}s"
            except ToolError as e:  # a refusal is an answer, not an outage: no circuit strike
                return "failed", f"error: {e}", attempt + 1, True
            except TRANSIENT as e:
                status, error = "failed", f"{type(e).__name__}: {e}"
            # A bug or a permanent failure: retrying will not help.  SystemExit too (a wrapped
            # command-line tool's argparse exits on bad input): it must not end the agent.
            except (Exception, SystemExit) as e:
                return (
                    "failed",
                    f"error: {tool.name} failed: {type(e).__name__}: {e}",
                    attempt + 1,
                    False,
                )
            if attempt + 1 < self.retry.max_attempts:
                self.sleep(self.retry.delay(attempt, self.rng))
        return (
            status,
            (f"error: {tool.name} failed after {self.retry.max_attempts} attempts: {error}"),
            self.retry.max_attempts,
            False,
        )

    def _record(self, name: str, answered: bool) -> None:
        circuit = self._circuits[name]
        circuit.failures = 0 if answered else circuit.failures + 1
        if circuit.failures >= self.failure_threshold:
            circuit.failures = 0
            circuit.open_until = self.clock() + self.cooldown_s


def as_executor(tools: ToolExecutor | Sequence[Tool]) -> ToolExecutor:
    return tools if isinstance(tools, ToolExecutor) else ToolExecutor(tools)
