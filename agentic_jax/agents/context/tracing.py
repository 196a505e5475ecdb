"""Tracing: every model call, tool call and decision of a run as a structured event.

Events are flat JSON objects, one per line in a JSONL file, so a run can be replayed, diffed
against a golden run (``golden.py``), rendered (:func:`render`, ``agentic-jax trace show``) or
loaded into any log tool.  Each carries ``run``, ``seq``, ``time`` and ``kind``:

* ``run_start`` (task, agent) and ``run_end`` (answer, stop_reason, detail, totals);
* ``model_call``: text, tool_calls, prompt/completion tokens, cost, latency, finish_reason;
* ``tool_call``: name, arguments, status, content (clipped), attempts, latency; ``data: true``
  records that the content is tool output (data), not instructions;
* ``decision``: what the loop decided and why (answer, redirect, stop, replan, reflect, ...);
* ``message``: one agent's message to others in a multi-agent run (``multi_agent``): sender,
  recipients, act (task, result, bid, ...), content (clipped), round.

Events of a multi-agent run also name the ``agent`` they belong to (see :meth:`Tracer.scoped`).

Each event is also an OpenTelemetry span, so runs show up in Jaeger, Honeycomb or any OTLP backend
configured in the process; without a configured SDK the spans are the API's no-ops.  The run,
model calls and tool calls are named and attributed by the GenAI semantic conventions
(https://opentelemetry.io/docs/specs/semconv/gen-ai/), as the OpenAI-compatible server's spans
are: the run is an ``invoke_agent {agent}`` span, and each model call a ``chat {model}`` span and
each tool call an ``execute_tool {tool}`` span inside it, timed by the event's latency.  Every
span also carries the event's own fields as ``agent.*`` attributes; decisions and messages are
``agent.decision {decision}`` and ``agent.message`` spans.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace

from agentic_jax.agents.policies.base import AssistantMessage
from agentic_jax.agents.tools.budget import Pricing
from agentic_jax.data.chat import ToolCall
from agentic_jax.text import clip

Event = dict[str, Any]
Sink = Callable[[Event], None]
CONTENT_LIMIT = 2000


def _arguments(call: ToolCall) -> dict | str:
    """JSON-ready arguments; text that never parsed as a JSON object is recorded as it is."""
    return call.arguments if isinstance(call.arguments, str) else dict(call.arguments)


def _attributes(event: Event) -> dict:
    """OpenTelemetry attributes must be primitives: nested values go as JSON."""
    return {
        f"agent.{k}": v if isinstance(v, (str, bool, int, float)) else json.dumps(v, default=str)
        for k, v in event.items()
        if v is not None
    }


def _gen_ai(event: Event, model: str | None) -> tuple[str, dict]:
    """The span name and ``gen_ai.*`` attributes of a ``run_start``, ``model_call`` or
    ``tool_call`` event by the GenAI semantic conventions (names checked against
    ``opentelemetry-semantic-conventions`` by the tests); ``("", {})`` for other kinds.

    The conventions name a span ``{operation} {model or agent or tool}``, or the operation alone
    when that is unknown (a tracer told no ``model``).  The run id is the agent's id and, unless
    the event belongs to a conversation of its own (the message bus's ``conversation_id``), the
    conversation's.  The harness's tool calls carry no id, so a call's id is its event's place in
    the run."""
    kind, agent = event["kind"], event.get("agent")
    if kind == "run_start":
        operation, target = "invoke_agent", agent
        attributes = {
            "gen_ai.agent.id": event["run"],
            "gen_ai.conversation.id": event.get("conversation_id", event["run"]),
        }
    elif kind == "model_call":
        operation, target = "chat", model
        attributes = {
            "gen_ai.usage.input_tokens": event["prompt_tokens"],
            "gen_ai.usage.output_tokens": event["completion_tokens"],
            "gen_ai.response.finish_reasons": [event["finish_reason"]],
        }
    elif kind == "tool_call":
        operation, target = "execute_tool", event["name"]
        attributes = {
            "gen_ai.tool.name": event["name"],
            "gen_ai.tool.call.id": f"call_{event['run']}_{event['seq']}",
            "gen_ai.tool.type": "function",
            "error.type": None if event["status"] == "ok" else event["status"],
        }
    else:
        return "", {}
    attributes |= {
        "gen_ai.operation.name": operation,
        "gen_ai.agent.name": agent,
        "gen_ai.request.model": model if kind != "tool_call" else None,
    }
    name = f"{operation} {target}" if target else operation
    return name, {k: v for k, v in attributes.items() if v is not None}


class Tracer:
    """Collects a run's events in ``events``, appends them to ``path`` (JSONL) and hands them to
    ``sinks`` (e.g. a console printer) as they happen.  ``model``: the name of the model the
    policy calls, for the spans' ``gen_ai.request.model`` (the events do not record it)."""

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        sinks: Sequence[Sink] = (),
        pricing: Pricing = Pricing(),
        run_id: str | None = None,
        otel: bool = True,
        model: str | None = None,
    ):
        self.path = None if path is None else Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.sinks, self.pricing, self.model = list(sinks), pricing, model
        self.run_id = run_id or uuid.uuid4().hex[:12]
        self.events: list[Event] = []
        self.fields: dict[str, Any] = {}
        self._otel = trace.get_tracer("agentic_jax.agents") if otel else None
        # Shared with the scoped views (``copy.copy`` keeps these references), which may run in
        # threads: the lock, and the stack of open ``invoke_agent`` spans, innermost last, so that
        # a view made before ``run_start`` still parents its spans to the run, and a nested
        # run's span to the run around it.
        self._open_runs: list = []
        self._lock = threading.Lock()

    def scoped(self, **fields: Any) -> Tracer:
        """A view that adds ``fields`` (e.g. ``agent="critic"``) to each event it emits; the
        events land in this tracer (same list, file, sinks and run id)."""
        view = copy.copy(self)
        view.fields = {**self.fields, **fields}
        return view

    def emit(self, kind: str, **fields: Any) -> Event:
        # Views in parallel branches (graph.parallel) share the list: numbering, appending and
        # writing happen at once, so seq numbers are unique and the file is in seq order.
        with self._lock:
            event = {
                "run": self.run_id,
                "seq": len(self.events),
                "time": time.time(),
                "kind": kind,
                **self.fields,
                **fields,
            }
            self.events.append(event)
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps(event, ensure_ascii=False, default=str) + "\n")
        for sink in self.sinks:
            sink(event)
        self._span(event)
        return event

    def _span(self, event: Event) -> None:
        """The event's span: from its start (its time less its latency) to its time.  A run's
        span stays open from ``run_start`` to ``run_end`` and is the parent of the spans between
        them."""
        if self._otel is None:
            return
        kind = event["kind"]
        with self._lock:
            parent = self._open_runs[-1] if self._open_runs else None
            if kind == "run_end" and parent is not None:
                self._open_runs.pop()
        end = int(event["time"] * 1e9)
        if kind == "run_end" and parent is not None:
            parent.set_attributes(_attributes(event))
            parent.end(end_time=end)
            return
        name, gen_ai = _gen_ai(event, self.model)
        if not name:
            detail = event.get("name") or event.get("decision") or ""
            name = f"agent.{kind}" + (f" {detail}" if detail else "")
        span = self._otel.start_span(
            name,
            context=None if parent is None else trace.set_span_in_context(parent),
            start_time=end - int(event.get("latency_s", 0.0) * 1e9),
            attributes=_attributes(event) | gen_ai,
        )
        if kind == "run_start":
            with self._lock:
                self._open_runs.append(span)
        else:
            span.end(end_time=end)

    # ----------------------------------------------------------------------------- event kinds
    def model_call(self, step: int, response: AssistantMessage, latency_s: float) -> Event:
        u = response.usage
        return self.emit(
            "model_call",
            step=step,
            text=response.text,
            tool_calls=[{"name": c.name, "arguments": _arguments(c)} for c in response.tool_calls],
            prompt_tokens=u.prompt_tokens,
            completion_tokens=u.completion_tokens,
            cost=self.pricing.cost(u),
            latency_s=latency_s,
            finish_reason=response.finish_reason,
        )

    def tool_call(self, step: int, result) -> Event:
        return self.emit(
            "tool_call",
            step=step,
            name=result.call.name,
            arguments=_arguments(result.call),
            status=result.status,
            content=clip(result.content, CONTENT_LIMIT),
            attempts=result.attempts,
            latency_s=result.latency_s,
            data=True,
        )

    def decision(self, step: int, decision: str, detail: str = "", **fields: Any) -> Event:
        return self.emit("decision", step=step, decision=decision, detail=detail, **fields)

    def message(
        self, round: int, sender: str, recipients: Sequence[str], act: str, content: str
    ) -> Event:
        return self.emit(
            "message",
            round=round,
            sender=sender,
            recipients=list(recipients),
            act=act,
            content=clip(content, CONTENT_LIMIT),
        )


# --------------------------------------------------------------------------------- reading
def load(path: str | Path) -> list[Event]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_events(events: Iterable[Event], run: str | None = None) -> list[Event]:
    """The events of the run with id ``run`` -- by default the last run -- of a trace that may
    hold several: a :class:`Tracer` appends to its file, and a session writes one run per task."""
    events = list(events)
    runs = list(dict.fromkeys(e.get("run") for e in events))
    if run is None:
        run = runs[-1] if runs else None
    elif run not in runs:
        raise ValueError(f"no run {run!r} in the trace; it has {runs}")
    return [e for e in events if e.get("run") == run]


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_event(event: Event) -> str | None:
    """One event as a line or two of text (``None`` for events not worth showing)."""
    kind, step = event["kind"], event.get("step", "")
    if "agent" in event and kind not in ("run_start", "run_end"):
        step = f"{event['agent']} {step}"
    if kind == "run_start":
        return f"task: {event.get('task', '')}  [{event.get('agent', 'agent')}, run {event['run']}]"
    if kind == "model_call":
        lines = [
            f"[{step}] model  {event['prompt_tokens']}+{event['completion_tokens']} tokens, "
            f"{event['latency_s']:.2f}s" + (f": {_short(event['text'])}" if event["text"] else "")
        ]
        lines += [
            f"      -> {c['name']}({_short(c['arguments'], 160)})" for c in event["tool_calls"]
        ]
        return "\n".join(lines)
    if kind == "tool_call":
        return (
            f"[{step}] tool   {event['name']} {event['status']}, {event['latency_s']:.2f}s"
            + (f", {event['attempts']} attempts" if event["attempts"] > 1 else "")
            + f": {_short(event['content'])}"
        )
    if kind == "decision":
        return f"[{step}] {event['decision']}" + (f": {event['detail']}" if event["detail"] else "")
    if kind == "message":
        return (
            f"[round {event['round']}] {event['sender']} -> {', '.join(event['recipients'])}"
            f" ({event['act']}): {_short(event['content'])}"
        )
    if kind == "run_end":
        return (
            f"answer: {event.get('answer')}\n"
            f"stop: {event['stop_reason']} ({event['detail']}); {event['steps']} model calls, "
            f"{event['total_tokens']} tokens, ${event['cost']:.4f}, {event['wall_s']:.2f}s"
        )
    return None


def render(events: Iterable[Event]) -> str:
    """A readable transcript of one or more runs."""
    return "\n".join(line for line in map(format_event, events) if line is not None)


def console_sink(write: Callable[[str], Any] = print) -> Sink:
    """Prints each event as it happens (``agentic-jax agent`` streams its steps this way)."""

    def sink(event: Event) -> None:
        line = format_event(event)
        if line is not None:
            write(line)

    return sink
