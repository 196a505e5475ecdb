"""The web UI's runs: an agent (or team) working on a task in a thread, told as typed events.

A :class:`UIRun` turns what happens in a run into a list of events, each a ``(type, data)``
pair that the page receives over server-sent events (``app.py``):

* ``run_start`` (task, agent), ``run_end`` (answer, stop_reason, detail, totals) and ``error``
  (the run crashed): ``run_end`` or ``error`` is the last event of every run;
* ``token``: a piece of the model's text as it is generated (``text``);
* ``tool_call``: a call's card opens (``card``, ``name``); ``tool_args``: a piece of its
  arguments (``card``, ``text``); ``tool_result``: what it returned (``card``, ``status``,
  ``content``, ``latency_s``, ``attempts``; ``step``, the model turn that made the call, and
  ``call``, its place in that turn);
* ``approval_request`` (``approval``, ``card``, ``name``, ``arguments``, ``timeout_s``) and
  ``approval_result`` (``approval``, ``card``, ``approved``, ``by``: ``user``, ``timeout`` or
  ``stop``): a tool in the ``ask`` tier (``AgentConfig.approval``) waits for a person;
* ``model_call``, ``decision`` and ``message`` (one agent's message to others in a team): the
  harness's trace events (``context/tracing.py``), as the trace has them.

Tokens and argument pieces come from policies that stream (``policies.base.StreamingPolicy``);
the cards of a policy that answers whole turns open when its turn ends.  A call's card is the
first open card of the same agent with the same name and arguments, in the order the model made
them (the order the loop runs them in).

**Stopping** a run denies a pending approval at once and ends the run at its next event (a
model or tool call in progress finishes first: Python threads cannot be interrupted).  An
unanswered approval is denied after ``approval_timeout_s``.  Every run's harness trace goes to one
JSONL file, the run's id being its trace id.

**Retrying** runs a run's task again as a new run, from the start or from one of its steps: a
model turn (``step``) or a tool call (``call`` of turn ``step``) of a ReAct run.  A retry from a
step replays the steps before it (``react.Replay``): their turns and tool results, as this run's
events recorded them, stand in for the policy and the tools, which are not asked or run again
(a result longer than the trace keeps, ``tracing.CONTENT_LIMIT`` characters, is replayed as the
trace clipped it).  The new run's ``run_start`` names the run and step it retries
(``retry_of``, ``from_step``, ``from_call``), and the ``model_call``, ``tool_result`` and
``decision`` events of its replayed steps carry ``replayed: true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from agentic_jax.agents.context.tracing import Event, Tracer
from agentic_jax.agents.loops.react import Replay
from agentic_jax.agents.policies.base import AssistantMessage, Delta, OnDelta, Policy, Usage
from agentic_jax.agents.session import AgentConfig, make_agent
from agentic_jax.agents.tools.base import Tool
from agentic_jax.agents.tools.executor import Approver, ToolResult
from agentic_jax.data.chat import ToolCall

TERMINAL = ("run_end", "error")
RELAYED = ("run_start", "model_call", "decision", "message")  # trace events passed on as they are


class RunStopped(Exception):
    """Raised inside a run's thread at its next event once it is stopped."""


@dataclasses.dataclass(frozen=True)
class RunSetup:
    """What a :data:`Work` gets for one run: the ``task``, the ``tracer`` the run must trace to,
    the ``approver`` of ``ask``-tier tools, ``on_delta`` for its model's streamed turns and,
    for a retry from a step, the ``replay`` of the steps before it."""

    task: str
    tracer: Tracer
    approver: Approver
    on_delta: OnDelta
    replay: Replay | None = None


Work = Callable[[RunSetup], Any]  # runs the task; what it returns is not used


def agent_work(config: AgentConfig, policy: Policy, mcp_tools: Sequence[Tool] = ()) -> Work:
    """Runs ``config``'s agent (a fresh one per run, as ``agentic-jax agent`` does per task);
    ``mcp_tools`` are those of ``config.mcp_servers``, which the caller lists and closes."""

    def work(setup: RunSetup):
        hooks = {"tracer": setup.tracer, "approver": setup.approver, "on_delta": setup.on_delta}
        agent = make_agent(config, policy, mcp_tools=mcp_tools, **hooks)
        if setup.replay is None:
            return agent.run(setup.task)
        return agent.run(setup.task, replay=setup.replay)  # a ReAct run's (UIRun.replay_to)

    return work


def team_work(team) -> Work:
    """Runs a multi-agent ``team`` (a ``multi_agent`` pattern); its members answer whole turns."""
    return lambda setup: team.run(setup.task, tracer=setup.tracer)


def _arguments_key(arguments: Any) -> str:
    """Arguments as the trace and the executor both see them, in one comparable form."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(dict(arguments), sort_keys=True, default=str)


@dataclasses.dataclass
class _Card:
    id: str
    name: str
    agent: str | None
    key: str = ""  # the arguments' key, once the turn that made the call has ended
    done: bool = False
    call: int | None = None  # its place in that turn


@dataclasses.dataclass
class _Approval:
    id: str
    card: str | None
    answered: threading.Event = dataclasses.field(default_factory=threading.Event)
    approved: bool = False
    by: str = ""


class UIRun:
    """One run of ``work`` on ``task`` in a daemon thread; see the module docstring."""

    def __init__(
        self,
        work: Work,
        task: str,
        *,
        trace_path: str | Path,
        approval_timeout_s: float,
        model: str | None = None,
        replay: Replay | None = None,
    ):
        self.task, self.approval_timeout_s, self.replay = task, approval_timeout_s, replay
        self.tracer = Tracer(trace_path, sinks=[self._on_trace], model=model)
        self.id = self.tracer.run_id
        self.events: list[tuple[str, dict]] = []
        self.stopped = False
        self._work = work
        self._lock = threading.RLock()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()
        self._cards: list[_Card] = []
        self._streamed: dict[int, _Card] = {}  # the open turn's cards, by call number
        self._approvals: dict[str, _Approval] = {}
        # The replayed turns and results still to come, in the order the trace tells them.
        self._replaying = {
            "model_call": len(replay.turns) if replay else 0,
            "tool_call": len(replay.results) if replay else 0,
        }

    @property
    def origin(self) -> dict:
        """The run and step this run retries (``retry_of``, ...), or nothing."""
        return dict(self.replay.origin) if self.replay else {}

    # --------------------------------------------------------------------------- the event list
    @property
    def finished(self) -> bool:
        with self._lock:
            return bool(self.events) and self.events[-1][0] in TERMINAL

    def _post(self, type_: str, **data: Any) -> None:
        with self._lock:
            self.events.append((type_, {"run": self.id, **data}))
            waiters = list(self._waiters)
        for loop, wake in waiters:
            with contextlib.suppress(RuntimeError):  # a closed event loop: its reader is gone
                loop.call_soon_threadsafe(wake.set)

    async def follow(self, after: int = -1) -> AsyncIterator[tuple[int, str, dict]]:
        """``(index, type, data)`` of each event after index ``after``, as they happen, until
        the run's last event."""
        wake = asyncio.Event()
        waiter = (asyncio.get_running_loop(), wake)
        with self._lock:
            self._waiters.add(waiter)
        try:
            while True:
                wake.clear()
                with self._lock:
                    new = self.events[after + 1 :]
                    if not new and self.finished:
                        return
                for type_, data in new:
                    after += 1
                    yield after, type_, data
                    if type_ in TERMINAL:
                        return
                await wake.wait()
        finally:
            with self._lock:
                self._waiters.discard(waiter)

    # ------------------------------------------------------------------------------ the run
    def start(self) -> None:
        threading.Thread(target=self._run, name=f"ui-run-{self.id}", daemon=True).start()

    def _run(self) -> None:
        setup = RunSetup(self.task, self.tracer, self._approve, self._on_delta, self.replay)
        try:
            self._work(setup)
        except RunStopped:
            self._post("run_end", answer=None, stop_reason="stopped", detail="stopped by the user")
        except Exception as e:  # shown on the page, not lost in a thread
            self._post("error", error=f"{type(e).__name__}: {e}")

    def stop(self) -> None:
        """Denies a pending approval now and ends the run at its next event."""
        with self._lock:
            self.stopped = True
            pending = [a for a in self._approvals.values() if not a.answered.is_set()]
        for approval in pending:
            self._answer(approval, False, "stop")

    # ------------------------------------------------------------------------------ the cards
    def _open_card(self, name: str, agent: str | None) -> _Card:
        card = _Card(f"{self.id}-{len(self._cards)}", name, agent)
        self._cards.append(card)
        self._post("tool_call", card=card.id, name=name, agent=agent)
        return card

    def _card_for(self, name: str, arguments: Any, agent: str | None) -> _Card | None:
        key = _arguments_key(arguments)
        for card in self._cards:
            if not card.done and (card.name, card.key, card.agent) == (name, key, agent):
                return card
        return None

    def _on_delta(self, delta: Delta) -> None:
        """Streamed pieces of the open turn (dropped once the run is stopped)."""
        with self._lock:
            if self.stopped:
                return
            if delta.call is None:
                self._post("token", text=delta.text)
                return
            card = self._streamed.get(delta.call)
            if card is None:
                card = self._streamed[delta.call] = self._open_card(delta.name, None)
            if delta.arguments:
                self._post("tool_args", card=card.id, text=delta.arguments)

    def _on_trace(self, event: Event) -> None:
        """The tracer's sink: turns the harness's events into the page's, and stops a stopped
        run (raising :class:`RunStopped` in its thread)."""
        with self._lock:
            kind, agent = event["kind"], event.get("agent")
            # A replayed turn's cards are marked by their results: a retry from one of its calls
            # runs that call and the later ones live.
            marks = {"replayed": True} if self._replayed(kind) else {}
            data = {k: v for k, v in event.items() if k not in ("run", "kind")} | marks
            if kind == "model_call":
                streamed, self._streamed = self._streamed, {}
                for i, call in enumerate(event["tool_calls"]):
                    card = streamed.get(i)
                    if card is None:  # the policy answered the whole turn at once
                        card = self._open_card(call["name"], agent)
                        self._post("tool_args", card=card.id, text=_text(call["arguments"]))
                    card.agent, card.key, card.call = agent, _arguments_key(call["arguments"]), i
            if kind == "tool_call":
                card = self._card_for(event["name"], event["arguments"], agent)
                if card is not None:
                    card.done = True
                self._post("tool_result", card=card and card.id, call=card and card.call, **data)
            elif kind in RELAYED or kind == "run_end":
                self._post(kind, **data)
            if self.stopped and kind != "run_end":
                raise RunStopped

    def _replayed(self, kind: str) -> bool:
        """Whether the trace event of ``kind`` now told belongs to the replayed steps: the first
        model calls and tool calls (as many as the replay holds) and the decisions among them."""
        if kind in self._replaying:
            replayed = self._replaying[kind] > 0
            self._replaying[kind] -= replayed
            return replayed
        return kind == "decision" and any(self._replaying.values())

    # ------------------------------------------------------------------------------ retrying
    def replay_to(self, step: int, call: int | None = None) -> Replay:
        """The replay of this run's steps before its model turn ``step`` (1-based) or, given
        ``call``, before that call (0-based) of the turn; ``ValueError`` for a run that is no
        ReAct run or a step it has not finished."""
        with self._lock:
            events = list(self.events)
        agents = [data["agent"] for type_, data in events if type_ == "run_start"]
        if agents[:1] != ["react"]:
            raise ValueError(
                f"run {self.id} is a {agents[0] if agents else 'not started'} run: only a ReAct "
                "run (AgentConfig.loop = 'react') retries from a step"
            )
        turns = [data for type_, data in events if type_ == "model_call"]
        if not 1 <= step <= len(turns):
            raise ValueError(f"run {self.id} finished model turns 1 to {len(turns)}, not {step}")
        calls = turns[step - 1]["tool_calls"]
        if call is not None and not 0 <= call < len(calls):
            raise ValueError(
                f"turn {step} of run {self.id} made {len(calls)} calls, not call {call}"
            )

        def before(result: dict) -> bool:
            if result["step"] != step:
                return result["step"] < step
            return call is not None and result["call"] is not None and result["call"] < call

        results = [data for type_, data in events if type_ == "tool_result" and before(data)]
        return Replay(
            [_turn(data) for data in turns[: step if call is not None else step - 1]],
            [_result(data) for data in results],
            {"retry_of": self.id, "from_step": step, "from_call": call},
        )

    # ------------------------------------------------------------------------------ approvals
    def _approve(self, tool_: Tool, call: ToolCall) -> bool:
        """The approver of ``ask``-tier tools: asks the page and waits for its answer."""
        with self._lock:
            if self.stopped:
                return False
            card = self._card_for(call.name, call.arguments, None)
            approval = _Approval(f"{self.id}-a{len(self._approvals)}", card and card.id)
            self._approvals[approval.id] = approval
            self._post(
                "approval_request",
                approval=approval.id,
                card=approval.card,
                name=call.name,
                arguments=call.arguments_text(),
                timeout_s=self.approval_timeout_s,
            )
        if not approval.answered.wait(self.approval_timeout_s):
            self._answer(approval, False, "timeout")
        return approval.approved

    def _answer(self, approval: _Approval, approved: bool, by: str) -> bool:
        """Settles ``approval`` once (False if it was already settled)."""
        with self._lock:
            if approval.answered.is_set():
                return False
            approval.approved, approval.by = approved, by
            approval.answered.set()
            self._post(
                "approval_result",
                approval=approval.id,
                card=approval.card,
                approved=approved,
                by=by,
            )
        return True

    def answer(self, approval_id: str, approved: bool) -> bool:
        """The person's answer to a pending approval; False if there is none by that id (it
        was answered, timed out or never asked)."""
        approval = self._approvals.get(approval_id)
        return approval is not None and self._answer(approval, approved, "user")


def _turn(model_call: dict) -> AssistantMessage:
    """A model turn as its ``model_call`` event recorded it."""
    return AssistantMessage(
        model_call["text"],
        tuple(ToolCall(c["name"], c["arguments"]) for c in model_call["tool_calls"]),
        Usage(model_call["prompt_tokens"], model_call["completion_tokens"]),
        model_call["finish_reason"],
    )


def _result(tool_result: dict) -> ToolResult:
    """A tool's result as its ``tool_result`` event recorded it."""
    call = ToolCall(tool_result["name"], tool_result["arguments"])
    return ToolResult(
        call,
        tool_result["content"],
        tool_result["status"],
        tool_result["attempts"],
        tool_result["latency_s"],
    )


def _text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


class Runner:
    """The runs of one UI: one at a time, each traced to ``trace_path``."""

    def __init__(
        self,
        work: Work,
        *,
        trace_path: str | Path,
        approval_timeout_s: float = 60.0,
        model: str | None = None,
    ):
        if approval_timeout_s <= 0:
            raise ValueError(f"approval_timeout_s must be > 0, got {approval_timeout_s}")
        self.work, self.trace_path = work, Path(trace_path)
        self.approval_timeout_s, self.model = approval_timeout_s, model
        self.runs: dict[str, UIRun] = {}
        self._lock = threading.Lock()

    def start(self, task: str, replay: Replay | None = None) -> UIRun:
        """A new run of ``task`` (beginning with ``replay``); ``RuntimeError`` while another run
        is in progress."""
        with self._lock:
            busy = [r.id for r in self.runs.values() if not r.finished]
            if busy:
                raise RuntimeError(f"run {busy[0]} is in progress; stop it or wait for its end")
            run = UIRun(
                self.work,
                task,
                trace_path=self.trace_path,
                approval_timeout_s=self.approval_timeout_s,
                model=self.model,
                replay=replay,
            )
            self.runs[run.id] = run
        run.start()
        return run

    def retry(self, run: UIRun, step: int | None = None, call: int | None = None) -> UIRun:
        """A new run of ``run``'s task: from the start, or from its model turn ``step`` or that
        turn's tool call ``call``, the steps before replayed (:meth:`UIRun.replay_to`)."""
        return self.start(run.task, None if step is None else run.replay_to(step, call))

    def close(self) -> None:
        """Stops every run (at server shutdown)."""
        for run in list(self.runs.values()):
            run.stop()
