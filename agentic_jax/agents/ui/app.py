"""The web UI's ASGI app (Starlette): one HTML page, a little JavaScript, and a JSON + SSE API.

Routes (``{run}`` is a run's id, its trace id; every body is a JSON object):

* ``GET /``: the page (server-rendered HTML; ``static/ui.js`` draws the events with
  ``textContent`` only, so no model or tool text is ever read as HTML);
* ``POST /api/runs`` ``{"task"}`` (default: the config's task): starts a run, 201
  ``{"id", "task"}``; 409 while another run is in progress;
* ``GET /api/runs``: every run's id, task, whether it has finished and what it retries
  (``retry_of``, ``from_step``, ``from_call``, for a retry from a step);
* ``GET /api/runs/{run}/events``: the run's events (``runs.py``) as server-sent events, each
  with its index as the SSE id and its type as the SSE event; the stream ends after the run's
  last event.  A reconnecting client's ``Last-Event-ID`` (or ``?after=N``) resumes after it;
* ``POST /api/runs/{run}/approvals/{approval}`` ``{"approve": true|false}``: answers an
  approval request; 404 when it is no longer pending (answered, timed out, stopped);
* ``POST /api/runs/{run}/stop``;
* ``POST /api/runs/{run}/retry`` ``{}``: a new run of its task, 201 (409 while a run is in
  progress); ``{"step": n}`` or ``{"step": n, "call": i}``: a new run from its model turn ``n``
  or that turn's tool call ``i``, the steps before replayed, not run again (``runs.py``); 400
  for a step it cannot retry from;
* ``GET /api/runs/{run}/trace``: the run's harness trace as JSON Lines, and
  ``GET /runs/{run}/trace``: the same rendered as a list (``tracing.format_event``).

``agentic-jax ui`` serves it with uvicorn.
"""

from __future__ import annotations

import contextlib
import html
import json
import string
from collections.abc import Awaitable, Callable
from pathlib import Path

from sse_starlette.sse import EventSourceResponse, ServerSentEvent
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentic_jax.agents.context.tracing import format_event, load
from agentic_jax.agents.ui.runs import Runner, UIRun, Work
from agentic_jax.inference.serving.request_body import BodyError, parse_json_body

STATIC = Path(__file__).parent / "static"
MAX_BODY_BYTES = 64 * 2**10
MAX_JSON_DEPTH = 8


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> dict:
    """The request's JSON object (an empty body is an empty object); ``BodyError`` otherwise."""
    raw = await request.body()
    if not raw:
        return {}
    body = parse_json_body(raw, max_bytes=MAX_BODY_BYTES, max_depth=MAX_JSON_DEPTH)
    if not isinstance(body, dict):
        raise BodyError(400, "the request body must be a JSON object")
    return body


def _page(title: str, task: str) -> str:
    template = string.Template((STATIC / "index.html").read_text(encoding="utf-8"))
    return template.substitute(title=html.escape(title), task=html.escape(task))


def _trace_page(run: UIRun, lines: list[str]) -> str:
    items = "\n".join(f"<li>{html.escape(line)}</li>" for line in lines)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>trace {html.escape(run.id)}</title>"
        '<link rel="stylesheet" href="/static/ui.css"></head>\n'
        f"<body><h1>Trace of run {html.escape(run.id)}</h1>"
        f"<p>task: {html.escape(run.task)}</p>\n"
        f'<ol class="trace" id="trace">\n{items}\n</ol></body></html>\n'
    )


def ui_app(
    work: Work,
    *,
    trace_path: str | Path,
    task: str = "",
    title: str = "agentic-jax agent",
    approval_timeout_s: float = 60.0,
    model: str | None = None,
) -> Starlette:
    """The UI of ``work`` (``runs.agent_work`` or ``runs.team_work``): runs traced to
    ``trace_path``, ``task`` filled in on the page, ``ask``-tier approvals denied after
    ``approval_timeout_s``; ``model`` names the model in the traces' spans."""
    runner = Runner(work, trace_path=trace_path, approval_timeout_s=approval_timeout_s, model=model)

    def on_run(handler: Callable[[Request, UIRun], Awaitable[Response]]):
        """The endpoint of ``handler``, which gets the run the path names (404 if none)."""

        async def endpoint(request: Request) -> Response:
            run = runner.runs.get(request.path_params["run"])
            if run is None:
                return _error(404, f"no run {request.path_params['run']!r}")
            return await handler(request, run)

        return endpoint

    def described(run: UIRun) -> dict:
        return {"id": run.id, "task": run.task, **run.origin}

    def started(start_run: Callable[[], UIRun]) -> JSONResponse:
        try:
            run = start_run()
        except RuntimeError as e:
            return _error(409, str(e))
        except ValueError as e:
            return _error(400, str(e))
        return JSONResponse(described(run), status_code=201)

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(_page(title, task))

    async def start(request: Request) -> Response:
        try:
            body = await _body(request)
        except BodyError as e:
            return _error(e.status, str(e))
        run_task = body.get("task", task)
        if not isinstance(run_task, str) or not run_task.strip():
            return _error(400, "'task' must be non-empty text (the config has no task)")
        return started(lambda: runner.start(run_task.strip()))

    async def runs(request: Request) -> JSONResponse:
        return JSONResponse(
            [{**described(r), "finished": r.finished} for r in runner.runs.values()]
        )

    async def events(request: Request, run: UIRun) -> Response:
        resume = request.headers.get("last-event-id") or request.query_params.get("after", "-1")
        try:
            after = int(resume)
        except ValueError:
            return _error(400, f"the event index to resume after is not an integer: {resume!r}")

        async def stream():
            async for index, type_, data in run.follow(after):
                yield ServerSentEvent(
                    json.dumps(data, ensure_ascii=False, default=str), event=type_, id=str(index)
                )

        return EventSourceResponse(stream(), ping=15)

    async def approve(request: Request, run: UIRun) -> Response:
        try:
            body = await _body(request)
        except BodyError as e:
            return _error(e.status, str(e))
        if not isinstance(body.get("approve"), bool):
            return _error(400, "'approve' must be true or false")
        approval = request.path_params["approval"]
        if not run.answer(approval, body["approve"]):
            return _error(404, f"no pending approval {approval!r} (answered, timed out or stopped)")
        return JSONResponse({"approval": approval, "approved": body["approve"]})

    async def stop(request: Request, run: UIRun) -> Response:
        run.stop()
        return JSONResponse({"id": run.id, "stopped": True})

    async def retry(request: Request, run: UIRun) -> Response:
        try:
            body = await _body(request)
        except BodyError as e:
            return _error(e.status, str(e))
        step, call = body.get("step"), body.get("call")
        for name, value in (("step", step), ("call", call)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                return _error(400, f"'{name}' must be an integer, got {value!r}")
        if step is None and call is not None:
            return _error(400, "'call' needs the 'step' whose call it is")
        return started(lambda: runner.retry(run, step, call))

    def traced(run: UIRun) -> list[dict]:
        path = Path(trace_path)
        return [e for e in load(path) if e.get("run") == run.id] if path.exists() else []

    async def trace_jsonl(request: Request, run: UIRun) -> Response:
        lines = [json.dumps(e, ensure_ascii=False, default=str) + "\n" for e in traced(run)]
        return Response("".join(lines), media_type="application/x-ndjson")

    async def trace_page(request: Request, run: UIRun) -> Response:
        lines = [line for line in map(format_event, traced(run)) if line is not None]
        return HTMLResponse(_trace_page(run, lines))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        runner.close()

    routes = [
        Route("/", page),
        Route("/api/runs", start, methods=["POST"]),
        Route("/api/runs", runs),
        Route("/api/runs/{run}/events", on_run(events)),
        Route("/api/runs/{run}/approvals/{approval}", on_run(approve), methods=["POST"]),
        Route("/api/runs/{run}/stop", on_run(stop), methods=["POST"]),
        Route("/api/runs/{run}/retry", on_run(retry), methods=["POST"]),
        Route("/api/runs/{run}/trace", on_run(trace_jsonl)),
        Route("/runs/{run}/trace", on_run(trace_page)),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.runner = runner
    return app
