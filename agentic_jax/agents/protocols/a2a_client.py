"""Delegating tasks to remote Agent2Agent (A2A) agents, with the official ``a2a-sdk`` client.

:class:`RemoteAgent` resolves a remote agent's Agent Card first (its name, skills, endpoints and
whether it streams), then sends tasks and follows each until it *settles*: a terminal state
(completed, failed, rejected, canceled) or one that waits on the caller (input-required,
auth-required).  It streams when the card allows and falls back to polling ``GetTask`` every
``poll_interval_s`` when it does not or a stream ends early.  ``headers`` (an
``Authorization: Bearer ...`` token, an API key header) go with every request, the card's
included.  Its calls are synchronous, so any loop can use them; the SDK's async client runs on a
private event-loop thread.

Two adapters put a remote agent into agentic-jax:

* :func:`delegate_tool`: a :class:`~agentic_jax.agents.tools.base.Tool` any loop offers its model.  A
  completed task returns the artifacts' text; failed, rejected, canceled and auth-required tasks
  become tool errors saying so; input-required returns the remote agent's question with the
  ``task_id`` the model passes back, with its reply, to continue that task.
* :func:`delegate_node`: a :class:`~agentic_jax.agents.loops.graph.StateGraph` node sending one state
  field and writing the answer (and optionally the final state and the task id, to continue an
  input-required task on a later pass) to others.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import threading
import uuid
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, Self

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, get_message_text
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError

from agentic_jax.agents.tools.base import Tool, ToolError, TransientToolError, tool

SETTLED = {
    TaskState.TASK_STATE_COMPLETED,
    TaskState.TASK_STATE_FAILED,
    TaskState.TASK_STATE_REJECTED,
    TaskState.TASK_STATE_CANCELED,
    TaskState.TASK_STATE_INPUT_REQUIRED,
    TaskState.TASK_STATE_AUTH_REQUIRED,
}


def state_name(state: TaskState) -> str:
    """``TASK_STATE_INPUT_REQUIRED`` -> ``input-required`` (the protocol's words)."""
    return TaskState.Name(state).removeprefix("TASK_STATE_").lower().replace("_", "-")


@dataclasses.dataclass(frozen=True)
class RemoteResult:
    """Where a remote task settled.  ``text``: the artifacts' text when completed, else the
    status message (the error, the reason for rejection, the question)."""

    state: str
    text: str
    task_id: str
    context_id: str

    @property
    def ok(self) -> bool:
        return self.state == "completed"


class DelegationError(RuntimeError):
    """A remote task that did not complete (``result`` says how it ended), or a remote agent
    that could not be reached (``transient``: a network failure worth retrying)."""

    def __init__(
        self, message: str, result: RemoteResult | None = None, *, transient: bool = False
    ):
        super().__init__(message)
        self.result, self.transient = result, transient


def _result(task: Task) -> RemoteResult:
    state = state_name(task.status.state)
    if task.status.state == TaskState.TASK_STATE_COMPLETED and task.artifacts:
        text = "\n".join(get_artifact_text(a) for a in task.artifacts)
    else:
        text = get_message_text(task.status.message) if task.status.HasField("message") else ""
    return RemoteResult(state, text, task.id, task.context_id)


def _network_failure(error: Exception) -> bool:
    """Whether ``error`` is a network failure (refused, reset, timed out).  The SDK raises its own
    errors for httpx's, which it keeps as the cause."""
    return isinstance(error, httpx.TransportError) or isinstance(
        error.__cause__, httpx.TransportError
    )


def _task_id(response: StreamResponse) -> str:
    for field in ("task", "status_update", "artifact_update"):
        if response.HasField(field):
            event = getattr(response, field)
            return event.id if field == "task" else event.task_id
    return ""


class RemoteAgent:
    """A remote A2A agent at ``url`` (its base URL, where ``/.well-known/agent-card.json`` is).

    ``timeout_s`` bounds one :meth:`send` (the remote task is canceled when it runs out);
    ``streaming=False`` polls even when the agent streams; ``transport`` replaces the network
    (an ``httpx.ASGITransport`` serves an in-process app).
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 300.0,
        poll_interval_s: float = 0.5,
        streaming: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.url, self.timeout_s, self.poll_interval_s = url, timeout_s, poll_interval_s
        self.streaming = streaming
        self._headers, self._transport = dict(headers or {}), transport
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="a2a-client", daemon=True
        )
        self._thread.start()
        self._http: httpx.AsyncClient | None = None
        self._client = None
        self._card: AgentCard | None = None

    def _run(self, coroutine: Coroutine) -> Any:
        if self._loop.is_closed():
            raise DelegationError(f"the client of {self.url} is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _connect(self):
        if self._client is None:
            self._http = self._http or httpx.AsyncClient(
                headers=self._headers, transport=self._transport, timeout=self.timeout_s
            )
            try:
                self._card = await A2ACardResolver(self._http, self.url).get_agent_card()
            except A2AError as e:
                raise DelegationError(
                    f"could not resolve the agent card of {self.url}: {e}",
                    transient=_network_failure(e),
                ) from e
            streams = self.streaming and self._card.capabilities.streaming
            config = ClientConfig(streaming=streams, polling=not streams, httpx_client=self._http)
            self._client = ClientFactory(config).create(self._card)
        return self._client

    @property
    def card(self) -> AgentCard:
        """The remote agent's card (fetched on first use)."""
        self._run(self._connect())
        return self._card

    def send(
        self,
        text: str,
        *,
        task_id: str | None = None,
        context_id: str | None = None,
        on_event: Callable[[StreamResponse], None] | None = None,
    ) -> RemoteResult:
        """Sends ``text`` as a new task, or as the next message of ``task_id`` (answering an
        input-required task), and waits until the task settles; ``on_event`` sees each streamed
        event.  :class:`DelegationError` if the agent cannot be reached or ``timeout_s`` runs
        out."""
        return self._run(self._send(text, task_id, context_id, on_event))

    def cancel(self, task_id: str) -> RemoteResult:
        return self._run(self._cancel(task_id))

    async def _cancel(self, task_id: str) -> RemoteResult:
        client = await self._connect()
        try:
            return _result(await client.cancel_task(CancelTaskRequest(id=task_id)))
        except (A2AError, httpx.HTTPError) as e:
            raise DelegationError(
                f"could not cancel task {task_id} of {self.url}: {type(e).__name__}: {e}"
            ) from e

    async def _send(self, text, task_id, context_id, on_event) -> RemoteResult:
        client = await self._connect()
        message = Message(
            role=Role.ROLE_USER,
            message_id=uuid.uuid4().hex,
            parts=[Part(text=text)],
            task_id=task_id or "",
            context_id=context_id or "",
        )
        started: list[str] = [task_id or ""]
        try:
            return await asyncio.wait_for(
                self._follow(client, message, started, on_event), self.timeout_s
            )
        except TimeoutError:
            if started[0]:
                await self._cancel_quietly(client, started[0])
            raise DelegationError(
                f"{self._card.name!r} did not settle the task within "
                f"{self.timeout_s}s; it was canceled"
            ) from None
        except (A2AError, httpx.HTTPError) as e:
            raise DelegationError(
                f"the request to {self._card.name!r} at {self.url} failed: {type(e).__name__}: {e}",
                transient=_network_failure(e),
            ) from e

    async def _follow(self, client, message: Message, started: list[str], on_event) -> RemoteResult:
        """Streams (or sends once), then polls until the task settles."""
        async for response in client.send_message(SendMessageRequest(message=message)):
            if on_event is not None:
                on_event(response)
            if response.HasField("message"):  # a direct reply: no task was made
                reply = response.message
                return RemoteResult("completed", get_message_text(reply), "", reply.context_id)
            started[0] = _task_id(response) or started[0]
        while True:
            task = await client.get_task(GetTaskRequest(id=started[0]))
            if task.status.state in SETTLED:
                return _result(task)
            await asyncio.sleep(self.poll_interval_s)

    @staticmethod
    async def _cancel_quietly(client, task_id: str) -> None:
        # It may have settled meanwhile; the timeout is what gets reported.
        with contextlib.suppress(A2AError, httpx.HTTPError):
            await client.cancel_task(CancelTaskRequest(id=task_id))

    def close(self) -> None:
        """Closes the connection and the client's event-loop thread."""
        if self._loop.is_closed():
            return
        try:
            self._run(self._shutdown())
        finally:  # a connection that fails to close must not leave the thread running
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    async def _shutdown(self) -> None:
        """Closes the client, then the connection, then cancels what is left: each step runs
        even when one before it raised (the callbacks run last pushed first)."""
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(_cancel_pending)
            if self._http is not None:
                stack.push_async_callback(self._http.aclose)
            if self._client is not None:
                stack.push_async_callback(self._client.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _cancel_pending() -> None:
    """Cancels what is left on the loop (as ``asyncio.run`` does before closing one)."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_") or "agent"


def delegate_tool(
    remote: RemoteAgent, *, name: str | None = None, description: str | None = None
) -> Tool:
    """A tool sending a task to ``remote``; its name and description come from the remote
    agent's card (resolved now) unless given."""
    card = remote.card
    tool_name = name or f"ask_{_slug(card.name)}"
    skills = "; ".join(f"{s.name}: {s.description}" for s in card.skills)
    summary = description or (
        f"Delegate a task to the remote agent {card.name!r} "
        f"({card.description}) and return its answer. Its skills: {skills}"
    )

    def delegate(task: str, task_id: str = "") -> str:
        """Sends a task to the remote agent and returns its answer.

        Args:
            task: the task, self-contained, in words; or your reply to the agent's question.
            task_id: only to continue a task that asked a question: the id it gave.
        """
        try:
            result = remote.send(task, task_id=task_id or None)
        except DelegationError as e:
            raise (TransientToolError if e.transient else ToolError)(str(e)) from e
        if result.ok:
            return result.text
        if result.state == "input-required":
            return (
                f"The remote agent {card.name!r} needs more input: {result.text}\n"
                f"To answer, call {tool_name} again with your reply as task and "
                f"task_id={result.task_id!r}."
            )
        verb = {
            "rejected": "declined the task",
            "canceled": "canceled the task",
            "auth-required": "needs authentication",
        }.get(result.state, "failed")
        raise ToolError(
            f"the remote agent {card.name!r} {verb}: {result.text or 'no reason given'}"
        )

    return tool(delegate, name=tool_name, description=summary, timeout_s=None)


def delegate_node(
    remote: RemoteAgent,
    *,
    input_key: str = "input",
    output_key: str = "output",
    state_key: str | None = None,
    task_key: str | None = None,
):
    """A graph node sending the state's ``input_key`` to ``remote`` and writing the answer to
    ``output_key``.  With ``state_key`` the final state (``completed``, ``failed``,
    ``input-required``, ...) is written there for a router to branch on; without it, a task that
    does not complete raises :class:`DelegationError`.  With ``task_key`` a non-empty task id in
    that field continues that task, and the result's task id is written back."""

    def node(state) -> dict:
        task_id = getattr(state, task_key) if task_key else None
        result = remote.send(str(getattr(state, input_key)), task_id=task_id or None)
        if state_key is None and not result.ok:
            raise DelegationError(f"the remote task ended {result.state}: {result.text}", result)
        update = {output_key: result.text}
        if state_key is not None:
            update[state_key] = result.state
        if task_key is not None:
            update[task_key] = result.task_id
        return update

    return node
