"""Serving an agentic-jax agent over the Agent2Agent (A2A) protocol with the official ``a2a-sdk``.

A2A (https://a2a-protocol.org, v1.0) lets agents call each other as opaque services: a client
reads the server's *Agent Card* (``/.well-known/agent-card.json``: name, skills, endpoints,
authentication), sends a message, and follows the *task* it starts through its states::

    submitted -> working -> completed | failed | rejected | canceled
                    \\-> input-required -> (follow-up message on the task) -> working -> ...

:class:`AgentTaskExecutor` maps any :class:`~agentic_jax.agents.loops.agent.Agent` (a ReAct loop over
any policy, plan-and-execute, ...) onto that lifecycle.  Each task runs the agent in a worker
thread, built afresh by an :data:`AgentFactory` from a :class:`TaskSetup`, which carries

* the task's harness tools, which the agent should offer its model:

  - ``ask_user(question)``: the task goes to **input-required** with the question as its status
    message; the agent thread waits, and the client's next message on the same task is the tool's
    result, so the run continues where it stopped (history, budget and all);
  - ``decline_task(reason)``: the task ends **rejected** with that reason (A2A's "the agent will
    not do this task"), after the model's closing reply;

* a :class:`~agentic_jax.agents.context.tracing.Tracer` whose events (model calls, tool calls, decisions)
  stream to the client as **working** status updates (text, with the event as metadata);
* an approval gate that asks the client (input-required, "yes"/"no") before a tool marked
  ``dangerous`` runs.

The answer of a run that stops with ``StopReason.ANSWER`` becomes the ``answer`` artifact and the
task **completes**; any other stop (budget, policy error, loop detection) **fails** it with the
harness's reason; a human rejection at a gate **rejects** it.  **Canceling** a task stops its run
at the next step boundary (a model or tool call in progress finishes first: Python threads cannot
be interrupted) and unblocks a run waiting for input.  Runs live in the server process: a task
waiting for input does not survive a restart (its follow-up then fails with a message saying so).

:func:`a2a_app` assembles the SDK's request handler, JSON-RPC and HTTP+JSON routes and card route
into a Starlette ASGI app (``uvicorn`` serves it; ``agentic-jax a2a-server`` does all of this from
a gin config); with ``bearer_token`` every route but the card requires ``Authorization: Bearer``,
and the card declares that scheme.  The client side, delegating to remote agents, is
``a2a_client.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import json
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import gin
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    Message,
    Part,
    SecurityRequirement,
    SecurityScheme,
    StringList,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.constants import (
    AGENT_CARD_WELL_KNOWN_PATH,
    PROTOCOL_VERSION_CURRENT,
    TransportProtocol,
)
from starlette.applications import Starlette
from starlette.authentication import (
    AuthCredentials,
    AuthenticationBackend,
    AuthenticationError,
    SimpleUser,
)
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from agentic_jax.agents.context.tracing import Event, Tracer, format_event
from agentic_jax.agents.loops.agent import Agent, AgentResult
from agentic_jax.agents.policies.base import Policy
from agentic_jax.agents.protocols.skills import (
    SKILLS_DIR,
    Skill,
    SkillRegistry,
    skill_tools,
    with_skills,
)
from agentic_jax.agents.session import AgentConfig, make_agent
from agentic_jax.agents.tools.base import Tool, ToolError, tool
from agentic_jax.agents.tools.budget import StopReason
from agentic_jax.agents.tools.builtin import builtin_tool
from agentic_jax.agents.tools.executor import Approver
from agentic_jax.data.chat import ToolCall
from agentic_jax.inference.serving.request_body import BodyError, parse_json_body

ASK_USER = "ask_user"
DECLINE = "decline_task"
JSONRPC_PATH = "/"
REST_PATH = "/rest"
BEARER_SCHEME = "bearer"


class TaskCanceled(Exception):
    """Raised inside a run's thread at its next step once its task is canceled."""


@dataclasses.dataclass(frozen=True)
class TaskSetup:
    """What the server hands an :data:`AgentFactory` for one task: the user's ``task`` text, the
    harness ``tools`` (``ask_user``, ``decline_task``) to offer the model, the ``tracer`` that
    streams the run's steps, and the ``approver`` for dangerous tools."""

    task: str
    tools: tuple[Tool, ...]
    tracer: Tracer
    approver: Approver


AgentFactory = Callable[[TaskSetup], Agent]


def _text_message(updater: TaskUpdater, text: str) -> Message:
    return updater.new_agent_message([Part(text=text)])


def _jsonable(value: Any) -> Any:
    """A trace event as plain JSON (protobuf Structs take no other values)."""
    return json.loads(json.dumps(value, default=str))


class _TaskRun:
    """One agent run in a worker thread.  What the run reports reaches the event loop through
    ``outbox`` as ``(kind, payload)``: ``step`` (a trace event), ``input`` (a question),
    ``done`` (the result) or ``error``; the client's answers reach the run through ``answers``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, input_timeout_s: float | None):
        self.loop, self.input_timeout_s = loop, input_timeout_s
        self.outbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self.answers: queue.Queue[str | None] = queue.Queue()
        self.canceled = False
        self.waiting = False  # parked in input-required until a follow-up answers
        self.finished = False
        self.declined: str | None = None

    def post(self, kind: str, payload: Any = None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outbox.put_nowait, (kind, payload))
        except RuntimeError:  # the event loop is closed: the server is gone
            self.canceled = True

    def cancel(self) -> None:
        self.canceled = True
        self.answers.put(None)

    def ask(self, question: str) -> str:
        """Blocks the run until the client answers ``question``."""
        self.post("input", question)
        try:
            answer = self.answers.get(timeout=self.input_timeout_s)
        except queue.Empty:
            self.canceled = True
            raise ToolError(
                f"no answer within {self.input_timeout_s}s; the task is abandoned"
            ) from None
        if answer is None:
            raise ToolError("the task was canceled")
        return answer

    def approve(self, tool_: Tool, call: ToolCall) -> bool:
        try:
            answer = self.ask(
                f"Approve running {call.name}({call.arguments_text()})? Reply yes or no."
            )
        except ToolError:
            return False
        return answer.strip().lower() in ("y", "yes")

    def sink(self, event: Event) -> None:
        """The tracer sink: streams each step, and stops a canceled run at its next step."""
        if self.canceled:
            raise TaskCanceled("the task was canceled")
        self.post("step", event)

    def tools(self) -> tuple[Tool, Tool]:
        @tool(name=ASK_USER, timeout_s=None)
        def ask_user(question: str) -> str:
            """Ask the user a question and wait for the reply, which is the result.  Use it when
            the task is ambiguous or needs information only the user has.

            Args:
                question: one clear question for the user.
            """
            return self.ask(question)

        @tool(name=DECLINE, timeout_s=None)
        def decline_task(reason: str) -> str:
            """Decline the task when it is outside what you can or may do; afterwards reply
            with one short sentence and call no more tools.

            Args:
                reason: why the task is declined, for the user.
            """
            self.declined = reason
            return "The task is declined; reply with one short sentence and call no more tools."

        return ask_user, decline_task

    def start(self, make_agent: AgentFactory, task: str) -> None:
        def work():
            try:
                setup = TaskSetup(task, self.tools(), Tracer(sinks=[self.sink]), self.approve)
                outcome = ("done", make_agent(setup).run(task))
            except TaskCanceled:
                outcome = None
            except Exception as e:
                outcome = ("error", e)
            self.finished = True
            if outcome is not None and not self.canceled:
                self.post(*outcome)

        threading.Thread(target=work, name="a2a-task", daemon=True).start()


class AgentTaskExecutor(AgentExecutor):
    """Runs an agent built by ``make_agent`` per A2A task (see the module docstring).
    ``input_timeout_s``: how long a run waits for an answer before the task is abandoned
    (``None``: forever)."""

    def __init__(self, make_agent: AgentFactory, *, input_timeout_s: float | None = 3600.0):
        self.make_agent, self.input_timeout_s = make_agent, input_timeout_s
        self._runs: dict[str, _TaskRun] = {}

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        current = context.current_task
        task_id = context.task_id
        # A follow-up need not repeat the context id (the SDK then makes a new one up).
        context_id = current.context_id if current is not None else context.context_id
        updater = TaskUpdater(event_queue, task_id, context_id)
        text = context.get_user_input().strip()
        if current is None:
            await event_queue.enqueue_event(
                Task(
                    id=task_id,
                    context_id=context_id,
                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
            if not text:
                await updater.reject(
                    _text_message(updater, "This agent reads text: the message had no text part.")
                )
                return
            self._runs = {k: r for k, r in self._runs.items() if not r.finished}
            run = self._runs[task_id] = _TaskRun(asyncio.get_running_loop(), self.input_timeout_s)
            run.start(self.make_agent, text)
        else:
            run = self._runs.get(task_id)
            if run is None or run.canceled or not run.waiting:
                self._runs.pop(task_id, None)
                await updater.failed(
                    _text_message(
                        updater,
                        "No run of this task is waiting for input (it timed out or the "
                        "server restarted); send the task again.",
                    )
                )
                return
            if not text:
                await updater.requires_input(_text_message(updater, "Please answer in text."))
                return
            run.waiting = False
            run.answers.put(text)
        await updater.start_work()
        await self._relay(task_id, run, updater)

    async def _relay(self, task_id: str, run: _TaskRun, updater: TaskUpdater) -> None:
        """Publishes what the run reports until it needs input or ends."""
        while True:
            kind, payload = await run.outbox.get()
            if run.canceled:  # cancel() has published the terminal state
                return
            if kind == "step":
                line = format_event(payload)
                if line is not None:
                    await updater.update_status(
                        TaskState.TASK_STATE_WORKING,
                        _text_message(updater, line),
                        metadata={"event": _jsonable(payload)},
                    )
            elif kind == "input":
                run.waiting = True
                await updater.requires_input(_text_message(updater, payload))
                return
            else:
                self._runs.pop(task_id, None)
                await self._finish(run, updater, kind, payload)
                return

    @staticmethod
    async def _finish(run: _TaskRun, updater: TaskUpdater, kind: str, payload: Any) -> None:
        if kind == "error":
            await updater.failed(
                _text_message(updater, f"the agent crashed: {type(payload).__name__}: {payload}")
            )
            return
        result: AgentResult = payload
        metadata = {
            "stop_reason": result.stop_reason.value,
            "steps": result.steps,
            "prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.completion_tokens,
            "cost": result.cost,
            "wall_s": result.wall_s,
        }
        if run.declined is not None or result.stop_reason is StopReason.REJECTED:
            reason = run.declined if run.declined is not None else result.detail
            state, text = TaskState.TASK_STATE_REJECTED, reason
        elif result.ok:
            await updater.add_artifact(
                [Part(text=result.answer or "")], name="answer", last_chunk=True
            )
            state, text = TaskState.TASK_STATE_COMPLETED, result.answer or ""
        else:
            state, text = (
                TaskState.TASK_STATE_FAILED,
                f"{result.stop_reason.value}: {result.detail}",
            )
        await updater.update_status(state, _text_message(updater, text), metadata=metadata)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        run = self._runs.pop(context.task_id, None)
        if run is not None:
            run.cancel()
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel(_text_message(updater, "canceled at the client's request"))

    def close(self) -> None:
        """Cancels every run (at server shutdown)."""
        for run in self._runs.values():
            run.cancel()
        self._runs.clear()


def card_skill(skill: Skill) -> AgentSkill:
    return AgentSkill(
        id=skill.name,
        name=skill.name,
        description=skill.description,
        tags=["skill", *skill.tools],
        examples=list(skill.examples),
    )


def tool_skill(tool_: Tool) -> AgentSkill:
    return AgentSkill(id=tool_.name, name=tool_.name, description=tool_.description, tags=["tool"])


def agent_card(
    name: str,
    description: str,
    url: str,
    *,
    skills: Sequence[Skill] = (),
    tools: Sequence[Tool] = (),
    version: str = "0.1.0",
) -> AgentCard:
    """The card of an agent served at ``url`` (JSON-RPC at ``url``, HTTP+JSON at
    ``url + REST_PATH``).  Its skills are ``skills``, or else one per tool in ``tools``, or else
    one general skill with the agent's description."""
    card_skills = (
        [card_skill(s) for s in skills]
        or [tool_skill(t) for t in tools]
        or [AgentSkill(id="general", name=name, description=description, tags=["general"])]
    )
    base = url.rstrip("/")
    interfaces = [
        AgentInterface(
            url=base + JSONRPC_PATH,
            protocol_binding=TransportProtocol.JSONRPC,
            protocol_version=PROTOCOL_VERSION_CURRENT,
        ),
        AgentInterface(
            url=base + REST_PATH,
            protocol_binding=TransportProtocol.HTTP_JSON,
            protocol_version=PROTOCOL_VERSION_CURRENT,
        ),
    ]
    return AgentCard(
        name=name,
        description=description,
        version=version,
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=card_skills,
    )


class _BearerTokens(AuthenticationBackend):
    """Every request but the public card's needs ``Authorization: Bearer <token>``."""

    def __init__(self, token: str):
        self.token = token.encode()

    async def authenticate(self, conn: HTTPConnection):
        if conn.url.path == AGENT_CARD_WELL_KNOWN_PATH:
            return None
        scheme, _, credentials = conn.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(credentials.encode(), self.token):
            raise AuthenticationError("missing or wrong bearer token")
        return AuthCredentials(["authenticated"]), SimpleUser("a2a-client")


def _unauthorized(conn: HTTPConnection, error: Exception) -> JSONResponse:
    return JSONResponse(
        {"error": str(error)}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
    )


def with_bearer_auth(card: AgentCard) -> AgentCard:
    """A copy of ``card`` declaring HTTP bearer authentication for every call."""
    secured = AgentCard()
    secured.CopyFrom(card)
    secured.security_schemes[BEARER_SCHEME].CopyFrom(
        SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(scheme="Bearer"))
    )
    secured.security_requirements.append(SecurityRequirement(schemes={BEARER_SCHEME: StringList()}))
    return secured


class _BodyGuard:
    """ASGI middleware that reads each POST body first and answers a malformed one itself
    (``request_body.py``): a JSON-RPC parse error (-32700) on the JSON-RPC route, a 400 or 413
    elsewhere.  The SDK would answer undecodable bytes and deep nesting with an internal error."""

    def __init__(self, app, *, max_bytes: int, max_depth: int):
        self.app, self.max_bytes, self.max_depth = app, max_bytes, max_depth

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                break
        body = b"".join(chunks)
        try:
            parse_json_body(body, max_bytes=self.max_bytes, max_depth=self.max_depth)
        except BodyError as e:
            if scope["path"] == JSONRPC_PATH:
                error = JSONResponse(
                    {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": str(e)}}
                )
            else:
                error = JSONResponse(
                    {"error": {"code": e.status, "message": str(e)}}, status_code=e.status
                )
            return await error(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:  # later reads wait for the client to disconnect, as usual
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def a2a_app(
    agent: AgentFactory | AgentExecutor,
    card: AgentCard,
    *,
    bearer_token: str | None = None,
    task_store: TaskStore | None = None,
    input_timeout_s: float | None = 3600.0,
    max_request_bytes: int = 4 * 2**20,
    max_json_depth: int = 64,
) -> Starlette:
    """An ASGI app serving ``agent`` (a factory, or an executor of your own) under ``card``;
    ``bearer_token`` requires that token on every call (the card then says so).  A POST body
    over ``max_request_bytes``, nested deeper than ``max_json_depth`` or not JSON at all is
    refused before the SDK reads it."""
    executor = (
        agent
        if isinstance(agent, AgentExecutor)
        else AgentTaskExecutor(agent, input_timeout_s=input_timeout_s)
    )
    if bearer_token is not None:
        card = with_bearer_auth(card)
    handler = DefaultRequestHandler(executor, task_store or InMemoryTaskStore(), card)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        if isinstance(executor, AgentTaskExecutor):
            executor.close()
        await handler.aclose()

    routes = [
        *create_agent_card_routes(card),
        *create_jsonrpc_routes(handler, JSONRPC_PATH),
        *create_rest_routes(handler, path_prefix=REST_PATH),
    ]
    middleware = (
        []
        if bearer_token is None
        else [
            Middleware(
                AuthenticationMiddleware,
                backend=_BearerTokens(bearer_token),
                on_error=_unauthorized,
            )
        ]
    )
    middleware.append(Middleware(_BodyGuard, max_bytes=max_request_bytes, max_depth=max_json_depth))
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


@gin.configurable(module="agents")
@dataclasses.dataclass
class A2AServerConfig:
    """What ``agentic-jax a2a-server`` publishes besides the agent (``agents.AgentConfig``):
    the card's name, description and version, and ``skills``: a directory of skill files
    (``"builtin"``: the shipped ones; ``None``: none, the card lists the tools).  Per task the
    ``skills_k`` skills most relevant to it join the system prompt, with their tools."""

    name: str = "agentic-jax agent"
    description: str = "A tool-using agent built with agentic-jax."
    version: str = "0.1.0"
    skills: str | None = None
    skills_k: int = 3
    input_timeout_s: float | None = 3600.0

    def registry(self) -> SkillRegistry:
        if self.skills is None:
            return SkillRegistry()
        registry = SkillRegistry.load(SKILLS_DIR if self.skills == "builtin" else self.skills)
        skill_tools(registry.skills())  # fails now, naming the tool, if a skill's is unknown
        return registry


def config_factory(
    config: AgentConfig,
    policy: Policy,
    skills: SkillRegistry | None = None,
    k: int = 3,
    mcp_tools: Sequence[Tool] = (),
) -> AgentFactory:
    """Builds the agent ``config`` describes for each task, with the ``k`` skills of ``skills``
    most relevant to the task in its system prompt and their tools added, and ``mcp_tools``
    (those of ``config.mcp_servers``, listed once by the host)."""

    def make(setup: TaskSetup) -> Agent:
        selected = skills.select(setup.task, k) if skills is not None else []
        tools = dict.fromkeys([*config.tools, *(t for s in selected for t in s.tools)])
        equipped = dataclasses.replace(
            config, tools=list(tools), system_prompt=with_skills(config.system_prompt, selected)
        )
        return make_agent(
            equipped,
            policy,
            tracer=setup.tracer,
            approver=setup.approver,
            extra_tools=setup.tools,
            mcp_tools=mcp_tools,
        )

    return make


def config_app(
    url: str,
    config: AgentConfig,
    server: A2AServerConfig,
    policy: Policy,
    *,
    bearer_token: str | None = None,
    mcp_tools: Sequence[Tool] = (),
) -> Starlette:
    """The app ``agentic-jax a2a-server`` serves at ``url``; ``mcp_tools`` are the tools of
    ``config.mcp_servers``, which the caller lists and closes (see ``session.open_mcp_client``)."""
    registry = server.registry()
    tools = [*(builtin_tool(name) for name in config.tools), *mcp_tools]
    card = agent_card(
        server.name,
        server.description,
        url,
        skills=registry.skills(),
        tools=tools,
        version=server.version,
    )
    return a2a_app(
        config_factory(config, policy, registry, server.skills_k, mcp_tools),
        card,
        bearer_token=bearer_token,
        input_timeout_s=server.input_timeout_s,
    )
