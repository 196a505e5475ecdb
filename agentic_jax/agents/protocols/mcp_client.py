"""A Model Context Protocol client: MCP servers' tools, resources and prompts for agentic-jax agents.

MCP (https://modelcontextprotocol.io) lets a host talk to tool servers over one JSON-RPC protocol.
This module drives the official SDK (``mcp``, 2.x) from the synchronous harness:

* **One event-loop thread per client.**  The SDK is async (anyio); each :class:`MCPClient` (or
  stand-alone :class:`MCPSession`) runs it in an anyio blocking portal, a thread with its own
  event loop.  Each connection's SDK ``Client`` is entered and left inside one task of that loop,
  requests run as tasks there, and the calling thread waits on a future.  ``close()`` (or
  leaving the ``with`` block) ends the connections, the server subprocesses and the thread.
* **Transports.**  A target is a command line (a list, or a string split like a shell would:
  the server runs as a subprocess spoken to over stdio), an ``http(s)://`` URL (Streamable HTTP),
  an in-process SDK server object (``MCPServer`` or low-level ``Server``), an SDK
  ``StdioServerParameters`` (for ``env`` and ``cwd``) or any SDK transport.
* **Tools** become :class:`MCPTool`\\ s, ordinary agentic-jax tools: the server's input schema is
  what the model sees, verbatim, and arguments are validated against it (jsonschema, the
  schema's own dialect, Draft 2020-12 by default as MCP specifies) before anything is sent.  An
  ``isError`` result or a protocol error becomes a :class:`ToolError`, which the executor shows
  the model; a timeout a ``TimeoutError``; a dropped connection an :class:`MCPConnectionError`
  (a ``ConnectionError``), which ``ToolExecutor`` retries as transient.
* **Progress and cancellation.**  ``call_tool(progress=fn)`` receives the server's progress
  notifications; ``start_call`` returns a future whose ``cancel()`` cancels the request, and a
  timeout does the same (the SDK then sends ``notifications/cancelled``).
* **Reconnection.**  A dropped connection (or a Streamable HTTP session the server no longer
  knows) is noticed by the request that hits it; the next request reconnects, with up to
  ``reconnect.max_attempts`` attempts spaced by exponential backoff with full jitter
  (``RetryPolicy``: attempt k waits ``uniform(0, min(max_delay, base_delay * 2**k))``).
  Listing and reading requests are then retried once; a tool call is not (it may have had
  effects before the connection dropped): that is the executor's decision.
* **Several servers.**  :class:`MCPClient` names each tool ``<server>__<tool>``, so tools of
  different servers never collide.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import importlib.metadata
import json
import logging
import random
import re
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Self

import anyio
import jsonschema
import mcp.types as mcp_types
import pydantic
from anyio.from_thread import BlockingPortal, start_blocking_portal
from mcp import Client, StdioServerParameters
from mcp.server import MCPServer, Server
from mcp.shared.exceptions import MCPError

from agentic_jax.agents.tools.base import Tool, ToolArgumentError, ToolError
from agentic_jax.agents.tools.executor import RetryPolicy
from agentic_jax.data.chat import Message

logger = logging.getLogger(__name__)

SEPARATOR = "__"
RECONNECT = RetryPolicy(max_attempts=4, base_delay_s=0.25, max_delay_s=4.0)
MAX_PAGES = 100  # of one listing: a server whose cursor never ends cannot hang a client
_SERVER_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_))*$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")  # what OpenAI-style tool names do not allow
_DROPPED = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError)
# What a Streamable HTTP server's 404 for a session it no longer has (it restarted, or expired the
# session) reads as: the Python and TypeScript SDKs' servers, and the SDK client's own stand-in.
_SESSION_GONE = ("Session not found", "Session terminated")

ProgressFn = Callable[[float, float | None, str | None], None]


class MCPConnectionError(ConnectionError):
    """No connection to an MCP server could be made, or it dropped during a request."""


def package_version() -> str:
    """agentic-jax's version as installed (what a client or server reports to its peer)."""
    try:
        return importlib.metadata.version("agentic-jax")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def as_target(target: Any) -> Any:
    """What the SDK's ``Client`` connects to, from a command line, a URL or an SDK object."""
    if isinstance(target, str):
        if target.startswith(("http://", "https://")):
            return target
        target = shlex.split(target)
    if isinstance(target, list | tuple):
        if not target or not all(isinstance(part, str) for part in target):
            raise ValueError(
                f"an MCP server command is a non-empty list of strings, got {target!r}"
            )
        return StdioServerParameters(command=target[0], args=list(target[1:]))
    if isinstance(target, StdioServerParameters | MCPServer | Server) or hasattr(
        target, "__aenter__"
    ):
        return target
    raise TypeError(
        f"cannot connect to {target!r}: expected a command line, an http(s) URL, an "
        f"MCP server object, StdioServerParameters or an MCP transport"
    )


def _is_drop(error: BaseException) -> bool:
    """A lost connection, or a lost HTTP session, which the specification says to replace with a
    new one (2025-06-18, Streamable HTTP, session management)."""
    if isinstance(error, MCPError):
        return error.code == mcp_types.CONNECTION_CLOSED or error.message in _SESSION_GONE
    return isinstance(error, _DROPPED)


def _block_text(block: Any) -> str:
    """A content block as text: text as is, media and binary resources as a short note."""
    if block.type == "text":
        return block.text
    if block.type in ("image", "audio"):
        return f"[{block.type} {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
    if block.type == "resource_link":
        return f"[resource {block.uri}]"
    contents = block.resource  # an embedded resource
    if isinstance(contents, mcp_types.TextResourceContents):
        return contents.text
    return f"[binary resource {contents.uri}, {contents.mime_type or 'unknown type'}]"


def result_text(result: mcp_types.CallToolResult) -> str:
    """A tool result as the text a model reads: its content blocks, else its structured content."""
    parts = [_block_text(block) for block in result.content]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class JSONArguments(pydantic.BaseModel):
    """Any JSON object: the ``arguments`` model of a tool whose schema is given as JSON schema
    (:class:`MCPTool` advertises and validates against that schema instead)."""

    model_config = pydantic.ConfigDict(extra="allow")


@dataclasses.dataclass(frozen=True)
class MCPTool(Tool):
    """An MCP server's tool as an agentic-jax :class:`Tool`.  ``input_schema`` is the server's,
    advertised verbatim and enforced by :meth:`validate`; ``server`` and ``remote_name`` say
    where calls go."""

    input_schema: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    server: str = ""
    remote_name: str = ""

    @property
    def parameters(self) -> dict:
        return copy.deepcopy(dict(self.input_schema))

    @functools.cached_property
    def _validator(self) -> jsonschema.protocols.Validator:
        cls = jsonschema.validators.validator_for(
            self.input_schema, default=jsonschema.Draft202012Validator
        )
        cls.check_schema(self.input_schema)
        return cls(self.input_schema)

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(f"arguments must be a JSON object, got {arguments!r}")
        errors = sorted(
            self._validator.iter_errors(dict(arguments)),
            key=lambda e: [str(p) for p in e.absolute_path],
        )
        if errors:
            reasons = "; ".join(
                f"{'.'.join(map(str, e.absolute_path)) or 'arguments'}: {e.message}" for e in errors
            )
            raise ToolArgumentError(f"invalid arguments for {self.name}: {reasons}")
        return dict(arguments)


def _wait(future: concurrent.futures.Future) -> Any:
    """The future's result; an interrupted wait (Ctrl-C) cancels the request."""
    try:
        return future.result()
    except BaseException:
        future.cancel()
        raise


async def _all_pages(list_page: Callable, field: str) -> list:
    items, cursor = [], None
    for _ in range(MAX_PAGES):
        page = await list_page(cursor=cursor)
        items += getattr(page, field)
        cursor = page.next_cursor
        if cursor is None:
            return items
    raise MCPError(mcp_types.INTERNAL_ERROR, f"the listing did not end after {MAX_PAGES} pages")


class MCPSession:
    """A synchronous connection to one MCP server (see the module docstring), made on first use.

    ``timeout_s`` bounds each request (``None``: no bound); ``portal`` is the event-loop thread
    to run on (default: one of its own, ended by :meth:`close`).  ``connects`` counts the
    connections made so far, so reconnections show.
    """

    def __init__(
        self,
        target: Any,
        *,
        name: str = "server",
        timeout_s: float | None = 30.0,
        reconnect: RetryPolicy = RECONNECT,
        portal: BlockingPortal | None = None,
        sleep: Callable[[float], None] = time.sleep,
        seed: int | None = None,
    ):
        self.target, self.name = as_target(target), name
        self.timeout_s, self.reconnect = timeout_s, reconnect
        self.sleep, self.rng = sleep, random.Random(seed)
        self.connects = 0
        self._stack = contextlib.ExitStack()
        self._portal = portal or self._stack.enter_context(
            start_blocking_portal(name=f"mcp-{name}")
        )
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._context: contextlib.AbstractContextManager | None = None
        self._dropped: Client | None = None  # set from the loop thread, so without the lock
        self._closed = False

    # ------------------------------------------------------------------------- connection
    def connect(self) -> None:
        """Connects now rather than at the first request (:class:`MCPConnectionError` if no
        attempt succeeds)."""
        self._connected()

    def _connected(self) -> Client:
        with self._lock:
            if self._closed:
                raise MCPConnectionError(f"the session with MCP server {self.name!r} is closed")
            if self._client is not None and self._client is not self._dropped:
                return self._client
            self._disconnect()
            error: Exception | None = None
            for attempt in range(self.reconnect.max_attempts):
                if attempt:
                    self.sleep(self.reconnect.delay(attempt - 1, self.rng))
                context = self._portal.wrap_async_context_manager(
                    Client(
                        self.target,
                        read_timeout_seconds=self.timeout_s,
                        client_info=mcp_types.Implementation(
                            name="agentic-jax", version=package_version()
                        ),
                    )
                )
                try:
                    client = context.__enter__()
                except Exception as e:
                    error = e
                    logger.info("connecting to MCP server %r failed: %r", self.name, e)
                    continue
                self._client, self._context = client, context
                self.connects += 1
                return client
            raise MCPConnectionError(
                f"could not connect to MCP server {self.name!r} in {self.reconnect.max_attempts} "
                f"attempts: {type(error).__name__}: {error}"
            ) from error

    def _disconnect(self) -> None:
        context, self._client, self._context = self._context, None, None
        if context is not None:
            try:
                context.__exit__(None, None, None)
            except Exception as e:
                logger.info("closing the connection to MCP server %r: %r", self.name, e)

    def close(self) -> None:
        """Ends the connection (and the server subprocess) and an event-loop thread of its own."""
        with self._lock:
            self._closed = True
            self._disconnect()
        self._stack.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------------- requests
    def _submit(self, request: Callable, *args) -> concurrent.futures.Future:
        return self._portal.start_task_soon(self._guarded, self._connected(), request, *args)

    async def _guarded(self, client: Client, request: Callable, *args) -> Any:
        try:
            return await request(client, *args)
        except Exception as e:
            if _is_drop(e):
                self._dropped = client
                raise MCPConnectionError(
                    f"lost the connection to MCP server {self.name!r}: {type(e).__name__}: {e}"
                ) from e
            if isinstance(e, MCPError) and e.code == mcp_types.REQUEST_TIMEOUT:
                raise TimeoutError(
                    f"MCP server {self.name!r}: {e.message} (no answer within "
                    f"the timeout; the request was cancelled)"
                ) from e
            raise

    def _request(self, request: Callable, *args) -> Any:
        """A request without side effects: retried once on a new connection if it drops."""
        future = self._submit(request, *args)  # a failure to connect is not retried again
        try:
            return _wait(future)
        except MCPConnectionError:
            return _wait(self._submit(request, *args))

    def list_tools(self) -> list[mcp_types.Tool]:
        return self._request(lambda c: _all_pages(c.list_tools, "tools"))

    def list_resources(self) -> list[mcp_types.Resource]:
        return self._request(lambda c: _all_pages(c.list_resources, "resources"))

    def list_prompts(self) -> list[mcp_types.Prompt]:
        return self._request(lambda c: _all_pages(c.list_prompts, "prompts"))

    def read_resource(self, uri: str) -> list:
        """The resource's contents (``TextResourceContents`` / ``BlobResourceContents``)."""
        return self._request(lambda c: c.read_resource(uri)).contents

    def read_text(self, uri: str) -> str:
        """A text resource's text (its parts joined); a binary part is a ``ValueError``."""
        parts = self.read_resource(uri)
        binary = [p for p in parts if not isinstance(p, mcp_types.TextResourceContents)]
        if binary:
            raise ValueError(
                f"resource {uri} of MCP server {self.name!r} is binary "
                f"({binary[0].mime_type}); use read_resource"
            )
        return "".join(p.text for p in parts)

    def get_prompt(
        self, name: str, arguments: Mapping[str, str] | None = None
    ) -> mcp_types.GetPromptResult:
        return self._request(lambda c: c.get_prompt(name, dict(arguments or {})))

    def prompt_messages(
        self, name: str, arguments: Mapping[str, str] | None = None
    ) -> list[Message]:
        """A prompt as agentic-jax chat messages, ready to start a conversation with."""
        return [
            Message(m.role, _block_text(m.content))
            for m in self.get_prompt(name, arguments).messages
        ]

    def start_call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        progress: ProgressFn | None = None,
    ) -> concurrent.futures.Future:
        """Starts a tool call; ``cancel()`` on the returned future cancels it on the server.
        ``timeout_s`` defaults to the session's; ``progress(progress, total, message)`` is
        called (on the event-loop thread: keep it quick) for each progress notification."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        on_progress = None
        if progress is not None:

            async def on_progress(value: float, total: float | None, message: str | None):
                progress(value, total, message)

        return self._submit(
            lambda c: c.call_tool(
                name,
                dict(arguments or {}),
                read_timeout_seconds=timeout,
                progress_callback=on_progress,
            )
        )

    def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout_s: float | None = None,
        progress: ProgressFn | None = None,
    ) -> mcp_types.CallToolResult:
        """The tool's result, errors included (``result.is_error``); see :meth:`start_call`."""
        return _wait(self.start_call(name, arguments, timeout_s=timeout_s, progress=progress))

    # ------------------------------------------------------------------------- as agent tools
    def _run_tool(self, remote_name: str, progress: ProgressFn | None, /, **arguments) -> str:
        # Positional-only, so a tool may have parameters called remote_name or progress.
        try:
            result = self.call_tool(remote_name, arguments, progress=progress)
        except MCPError as e:  # the server refused the request itself
            raise ToolError(f"MCP server {self.name!r}: {e.message}") from None
        text = result_text(result)
        if result.is_error:
            raise ToolError(text or f"{remote_name} failed on MCP server {self.name!r}")
        return text

    def tools(
        self,
        prefix: str = "",
        on_progress: Callable[[str, float, float | None, str | None], None] | None = None,
    ) -> list[MCPTool]:
        """The server's tools as agentic-jax tools named ``prefix + name`` (characters other than
        letters, digits, ``_`` and ``-`` become ``_``).  A tool whose schema is not a valid JSON
        schema is left out with a warning.  ``on_progress(tool name, progress, total, message)``
        receives their calls' progress.  Marked ``dangerous`` (so the executor's approval gate
        applies): tools the server annotates as destructive and not read-only."""
        out, timeout = {}, None if self.timeout_s is None else self.timeout_s + 5.0
        for spec in self.list_tools():
            name = prefix + _UNSAFE.sub("_", spec.name)
            if name in out:
                raise ValueError(
                    f"MCP server {self.name!r} has tools {out[name].remote_name!r} "
                    f"and {spec.name!r}, both named {name!r} here"
                )
            hints = spec.annotations
            progress = None if on_progress is None else functools.partial(on_progress, name)
            tool = MCPTool(
                name,
                spec.description or spec.title or spec.name,
                functools.partial(self._run_tool, spec.name, progress),
                JSONArguments,
                timeout,
                dangerous=bool(hints and hints.destructive_hint and not hints.read_only_hint),
                input_schema=spec.input_schema,
                server=self.name,
                remote_name=spec.name,
            )
            try:
                tool._validator  # noqa: B018  (compiles the schema, checking it)
            except jsonschema.SchemaError as e:
                logger.warning(
                    "MCP server %r: tool %r has an invalid input schema (%s); leaving it out",
                    self.name,
                    spec.name,
                    e.message,
                )
                continue
            out[name] = tool
        return list(out.values())


class MCPClient:
    """Several MCP servers at once, on one event-loop thread: ``servers`` maps a name (letters,
    digits, ``-`` and single ``_``) to a target (see :func:`as_target`).  Connections open on
    first use; :meth:`tools` gives every server's tools as ``<server>__<tool>``.

        with MCPClient({"time": ["mcp-server-time"], "local": "agentic-jax mcp-server"}) as mcp:
            agent = ReActAgent(policy, mcp.tools())
    """

    def __init__(
        self,
        servers: Mapping[str, Any],
        *,
        timeout_s: float | None = 30.0,
        reconnect: RetryPolicy = RECONNECT,
        on_progress: Callable[[str, float, float | None, str | None], None] | None = None,
    ):
        for name in servers:
            if not isinstance(name, str) or not _SERVER_NAME.match(name):
                raise ValueError(
                    f"MCP server name {name!r} must be letters, digits, '-' and "
                    f"single '_' (the name joins its tools' names with "
                    f"{SEPARATOR!r})"
                )
        self.on_progress = on_progress
        self._stack = contextlib.ExitStack()
        portal = (
            self._stack.enter_context(start_blocking_portal(name="mcp-client")) if servers else None
        )
        self.sessions: dict[str, MCPSession] = {}
        try:
            for name, target in servers.items():
                self.sessions[name] = MCPSession(
                    target, name=name, timeout_s=timeout_s, reconnect=reconnect, portal=portal
                )
        except BaseException:
            self._stack.close()
            raise

    def session(self, name: str) -> MCPSession:
        if name not in self.sessions:
            raise KeyError(f"no MCP server named {name!r}; servers: {sorted(self.sessions)}")
        return self.sessions[name]

    def tools(self) -> list[MCPTool]:
        """Every server's tools, named ``<server>__<tool>``, server by server."""
        return [
            t
            for name, session in self.sessions.items()
            for t in session.tools(name + SEPARATOR, self.on_progress)
        ]

    def call_tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, **options
    ) -> mcp_types.CallToolResult:
        """Calls ``<server>__<tool>`` (``options`` as for :meth:`MCPSession.call_tool`)."""
        server, sep, tool = name.partition(SEPARATOR)
        if not sep:
            raise KeyError(f"tool name {name!r} is not of the form <server>{SEPARATOR}<tool>")
        return self.session(server).call_tool(tool, arguments, **options)

    def close(self) -> None:
        """Closes every connection, then the event-loop thread."""
        try:
            for session in self.sessions.values():
                session.close()
        finally:
            self._stack.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
