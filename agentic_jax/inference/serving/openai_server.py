"""An OpenAI-compatible HTTP API over a checkpoint (``agentic-jax serve``).

Endpoints: ``POST /v1/chat/completions`` (messages; tools with ``tool_choice`` ``auto``,
``none``, ``required`` or a named function, several calls per turn unless
``parallel_tool_calls`` is false;
``response_format`` ``text``, ``json_object`` or ``json_schema``, decoded under its automaton in
the engine's batch; ``logprobs`` and ``top_logprobs``; ``n``, ``seed``, ``stop``,
``max_completion_tokens`` or ``max_tokens``; streaming, ``n > 1`` too), ``POST /v1/completions``
(prompts, ``n``, the legacy integer ``logprobs``; streaming), ``POST /v1/embeddings`` (with an
:class:`Embedder`: ``input``, ``encoding_format`` float or base64, ``dimensions`` for a
Matryoshka encoder's prefixes), ``GET /v1/models``,
``GET /v1/models/{model}``, ``GET /health``, ``GET /metrics`` (Prometheus, the model's
:class:`ServingMetrics`) and ``GET /openapi.json`` (an OpenAPI 3.1 document whose request
schemas are the pydantic request models' own).  Usage reports the prompt tokens the prefix
cache served (``prompt_tokens_details.cached_tokens``).  A streamed chunk carries its own
tokens' log-probabilities; a tool call streams as the API's deltas while it is decoded: its
index, id and name, then its arguments' JSON text piece by piece (``tool_call_stream``), which
join to the arguments of the same reply unstreamed.
Anything that speaks the OpenAI API (the ``openai`` client, LangGraph/LangChain's
``ChatOpenAI``, smolagents' ``OpenAIServerModel``, the OpenAI Agents SDK, :class:`HTTPPolicy`)
can then use an agentic-jax model.

An ASGI application on Starlette (:attr:`OpenAIServer.app`, which any ASGI server can serve),
served by uvicorn from a background thread (:meth:`OpenAIServer.start`) or from the calling one
(:meth:`OpenAIServer.serve_forever`).  Requests are tasks on one event loop; the engine's calls,
which block, run in worker threads, and all of them feed one :class:`EngineLoop`, so concurrent
requests are batched continuously by the engine.  Streaming is server-sent events
(sse-starlette), ending with ``data: [DONE]``.  With an ``api_key`` every endpoint but
``/health`` needs ``Authorization: Bearer <key>`` (401 otherwise), ``/metrics`` too: Prometheus
sends the key as its scrape config's ``authorization`` credentials.

**Observed.**  Every finished request is counted in ``/metrics`` by route and status (errors and
401s included; a path no route has is counted as ``other``), beside the engine's own metrics
(tokens, latencies, queue depth, batch, KV-cache use, prefix-cache hits, preemptions).  Each model
call is an OpenTelemetry span named and attributed by the GenAI semantic conventions (``chat
<model>`` or ``text_completion <model>``; ``gen_ai.request.*``, ``gen_ai.response.*``,
``gen_ai.usage.*``), through the ``tracer_provider`` given or the process's; without a configured
SDK the spans are the API's no-ops.

**No request can take the server down.**  Every field has a range the engine can hold, and the
limits of :class:`ServerLimits` (gin) bound what one request may ask for.  The client's mistakes
get the API's error object (``{"error": {"message", "type", "param", "code"}}``) with a 4xx:
undecodable bytes, invalid or too deeply nested JSON, out-of-range fields and fields the server
does not take (named) a 400, a body over the size limit a 413 as soon as that is known (by its
``Content-Length``, else while it streams in; the rest is not read), a body that stalls a 408, an
unknown path a 404, a method a path does not take a 405, too many requests at once a 503 with
``Retry-After``.  A failure of the server's own (the engine failed while serving the request) is
a 500 for that request alone; the engine loop resets and serves the next one, and ``/health``
reports its state (503 while it is not running).

**A generation ends with its client.**  A client that disconnects, mid-stream or while it waits
for a whole reply, stops its generation at the next piece of text, and the request is aborted in
the engine, freeing its slot; so does a tool call's at its next decoded piece.  (The turn of a
Hugging Face model offered tools produces nothing until it ends: it runs to its end first.)

**Shutdown is graceful.**  :meth:`OpenAIServer.close` (or SIGINT/SIGTERM under
:meth:`~OpenAIServer.serve_forever`) stops accepting connections, lets the requests in flight
finish for ``shutdown_grace_s`` and then stops the rest: each gets a 503 error object, as its
stream's last event if its stream has begun.

Not supported (a 400 naming the field): images and other non-text content, ``logit_bias``,
``audio``, ``modalities``, ``prediction``, ``echo``, ``suffix``, ``best_of`` and ``user``; nor is
a value of the wrong JSON type (``"n": "2"``, ``"seed": false``: no coercion).
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import dataclasses
import functools
import hmac
import json
import logging
import math
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple, Protocol

import anyio
import anyio.from_thread
import anyio.to_thread
import gin
import numpy as np
import pydantic
import uvicorn
from anyio.abc import ObjectReceiveStream, ObjectSendStream
from anyio.lowlevel import EventLoopToken, current_token
from opentelemetry import trace
from pydantic.json_schema import models_json_schema
from sse_starlette.sse import EventSourceResponse, SendTimeoutError
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from agentic_jax.data.chat import Message, ToolCall, ToolSpec
from agentic_jax.inference.decoding.sampling import INT32_MAX, SEED_RANGE
from agentic_jax.inference.errors import EngineFailure, RequestError
from agentic_jax.inference.serving.chat_model import (
    ChatModel,
    Generation,
    TokenLogprob,
    sampling_params,
)
from agentic_jax.inference.serving.engine import MAX_TOP_LOGPROBS
from agentic_jax.inference.serving.metrics import ServingMetrics
from agentic_jax.inference.serving.request_body import BodyError, parse_json_body, read_body
from agentic_jax.inference.serving.tool_call_stream import ToolCallDelta

log = logging.getLogger(__name__)
PROMPT_THREADS = 16  # most generations of one request in flight at once


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of :class:`OpenAIServer`.

    ``max_request_bytes``: the body (413 above it); ``max_json_depth``: nesting of the JSON body;
    ``max_messages``, ``max_tools``, ``max_prompts`` (of one ``/v1/completions`` request, and
    inputs of one ``/v1/embeddings`` request), ``max_n``
    (choices per prompt), ``max_stop`` stop strings of at most ``max_stop_chars`` characters each;
    ``max_concurrent_requests`` generating at once (503 beyond); ``read_timeout_s``: how long a
    client may stall while sending its body (408) or while a stream waits for it to read (the
    stream ends).
    """

    max_request_bytes: int = 4 * 2**20
    max_json_depth: int = 64
    max_messages: int = 1024
    max_tools: int = 128
    max_prompts: int = 64
    max_n: int = 8
    max_stop: int = 4
    max_stop_chars: int = 256
    max_concurrent_requests: int = 256
    read_timeout_s: float = 60.0

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(
                    f"ServerLimits.{field.name} must be positive, got {getattr(self, field.name)!r}"
                )


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.body = (
            status,
            {"error": {"message": message, "type": type_, "param": param, "code": code}},
        )

    def response(self) -> JSONResponse:
        """The error object with the headers its status asks for: when to retry a 503, the
        scheme of a 401, and ``Connection: close`` after a 408 or 413, whose body was not read
        to its end (the connection cannot carry another request)."""
        headers = {
            503: {"Retry-After": "1"},
            401: {"WWW-Authenticate": "Bearer"},
            408: {"Connection": "close"},
            413: {"Connection": "close"},
        }.get(self.status)
        return JSONResponse(self.body, status_code=self.status, headers=headers)


# The ends of a generation stopped by the server: nginx's 499 is logged, never read by anyone.
CLIENT_GONE = APIError(499, "the client closed the connection", code="client_closed_request")
SHUTTING_DOWN = APIError(
    503, "the server is shutting down; retry shortly", "server_error", code="server_shutting_down"
)


# ------------------------------------------------------------------------------- request schemas
class _Request(pydantic.BaseModel):
    """A request's part; a field the server does not take is a 400 naming it, never ignored, and
    so is a value of the wrong JSON type (strict: ``"2"`` is no integer, ``false`` no seed; an
    integer is a number)."""

    model_config = pydantic.ConfigDict(extra="forbid", strict=True)


class _Function(_Request):
    name: str
    arguments: str


class _ToolCallIn(_Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: _Function


class _ContentPart(_Request):
    type: str
    text: str | None = None


class _MessageIn(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[_ContentPart] | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None


class _FunctionSpec(_Request):
    name: str
    description: str = ""
    parameters: dict[str, Any] = {"type": "object", "properties": {}}


class _ToolIn(_Request):
    type: Literal["function"]
    function: _FunctionSpec


class _Sampling(_Request):
    model: str
    max_tokens: int | None = pydantic.Field(None, ge=1, le=INT32_MAX)
    temperature: float = pydantic.Field(1.0, ge=0, le=2)
    top_p: float = pydantic.Field(1.0, gt=0, le=1)
    top_k: int = pydantic.Field(0, ge=0, le=INT32_MAX)  # not OpenAI's; vLLM's extension
    frequency_penalty: float = pydantic.Field(0.0, ge=-2, le=2)
    presence_penalty: float = pydantic.Field(0.0, ge=-2, le=2)
    seed: int | None = pydantic.Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stop: str | list[str] | None = None
    n: int = pydantic.Field(1, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def params(self, choice: int = 0):
        """The sampling settings of choice ``choice``: seeded choices get consecutive seeds
        (wrapping around within the int64 range)."""
        low = SEED_RANGE[0]
        seed = None if self.seed is None else (self.seed + choice - low) % 2**64 + low
        try:
            return sampling_params(
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                max_tokens=self.requested_max_tokens,
                seed=seed,
                stop=self.stop,
                frequency_penalty=self.frequency_penalty,
                presence_penalty=self.presence_penalty,
            )
        except ValueError as e:  # e.g. an empty stop string
            raise APIError(400, str(e)) from None

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def check(self, limits: ServerLimits) -> None:
        """The bounds of ``limits`` on what this request asks for."""
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        if len(stops) > limits.max_stop or any(len(s) > limits.max_stop_chars for s in stops):
            raise APIError(
                400,
                f"stop: at most {limits.max_stop} strings of at most "
                f"{limits.max_stop_chars} characters",
                param="stop",
            )
        if self.n > limits.max_n:
            raise APIError(400, f"n={self.n}: at most {limits.max_n}", param="n")


class ChatCompletionRequest(_Sampling):
    messages: list[_MessageIn] = pydantic.Field(min_length=1)
    tools: list[_ToolIn] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = pydantic.Field(None, ge=1, le=INT32_MAX)
    response_format: dict[str, Any] | None = None  # checked by ChatModel.chat
    logprobs: bool = False
    top_logprobs: int | None = pydantic.Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check(self, limits: ServerLimits) -> None:
        super().check(limits)
        if None not in (self.max_tokens, self.max_completion_tokens) and (
            self.max_tokens != self.max_completion_tokens
        ):
            raise APIError(
                400,
                f"max_completion_tokens={self.max_completion_tokens} and its older name "
                f"max_tokens={self.max_tokens} differ; give one",
                param="max_completion_tokens",
            )
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        if len(self.messages) > limits.max_messages:
            raise APIError(
                400,
                f"{len(self.messages)} messages: at most {limits.max_messages}",
                param="messages",
            )
        if len(self.tools or ()) > limits.max_tools:
            raise APIError(
                400, f"{len(self.tools)} tools: at most {limits.max_tools}", param="tools"
            )


def _texts(field: str | list[str]) -> list[str]:
    return [field] if isinstance(field, str) else field


def _check_texts(texts: list[str], limits: ServerLimits, param: str, plural: str) -> None:
    """One text or a list of them, not empty and at most ``limits.max_prompts`` long."""
    if not texts:
        raise APIError(400, f"{param} must not be empty", param=param)
    if len(texts) > limits.max_prompts:
        raise APIError(400, f"{len(texts)} {plural}: at most {limits.max_prompts}", param=param)


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    # the legacy API's: how many likeliest alternatives to give beside each token's logprob
    logprobs: int | None = pydantic.Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    @property
    def prompts(self) -> list[str]:
        return _texts(self.prompt)

    def check(self, limits: ServerLimits) -> None:
        super().check(limits)
        _check_texts(self.prompts, limits, "prompt", "prompts")


class EmbeddingRequest(_Request):
    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = pydantic.Field(None, ge=1)

    @property
    def inputs(self) -> list[str]:
        return _texts(self.input)

    def check(self, limits: ServerLimits) -> None:
        _check_texts(self.inputs, limits, "input", "inputs")


class Embeddings(NamedTuple):
    vectors: np.ndarray  # float32 [N, dimension], unit rows
    prompt_tokens: int  # the tokens read to make them


class Embedder(Protocol):
    """What ``/v1/embeddings`` serves (an adapter of a trained encoder, passed in by the caller:
    this package may not import ``retrieval``).  ``name`` is the model clients ask for,
    ``dimension`` the embeddings' width, ``matryoshka_dimensions`` the shorter prefixes it was
    trained to be cut to (Kusupati et al. 2022; empty if none), which a request's
    ``dimensions`` may choose."""

    name: str
    dimension: int
    matryoshka_dimensions: tuple[int, ...]

    def embed(self, texts: Sequence[str]) -> Embeddings: ...


def _matryoshka_prefix(vectors: np.ndarray, dimensions: int) -> np.ndarray:
    """``t_m(x) = x[:m] / ‖x[:m]‖``, a Matryoshka embedding's prefix, normalised as the encoder
    normalises (a zero row stays zero)."""
    prefix = vectors[:, :dimensions]
    norm = np.sqrt(np.sum(prefix * prefix, axis=-1, keepdims=True))
    return prefix / np.maximum(norm, 1e-6)


def _text(content: str | list[_ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for part in content:
        if part.type != "text" or part.text is None:
            raise APIError(
                400,
                f"unsupported content part type {part.type!r} (only text parts with a text field)",
                param="messages",
            )
    return "".join(part.text for part in content)


def _message(m: _MessageIn) -> Message:
    # Arguments that are not a JSON object (a model's broken call, answered with an error) are
    # history too: they are kept as text, as the harness keeps them.
    calls = [ToolCall(c.function.name, c.function.arguments or "{}") for c in m.tool_calls or ()]
    return Message("system" if m.role == "developer" else m.role, _text(m.content), tuple(calls))


def _validation_error(e: pydantic.ValidationError) -> APIError:
    first = e.errors(include_url=False)[0]
    param = ".".join(map(str, first["loc"])) or None
    why = "this server does not take this field" if first["type"] == "extra_forbidden" else None
    message = why or first["msg"]
    return APIError(400, f"{param}: {message}" if param else message, param=param)


# ------------------------------------------------------------------------------- responses
def _usage(done: Sequence[Generation]) -> dict:
    """The usage of a reply's generations (each choice's prompt counts: each was prefilled)."""
    prompt = sum(g.prompt_tokens for g in done)
    completion = sum(g.completion_tokens for g in done)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": sum(g.cached_tokens for g in done)},
    }


def _completion_logprobs(tokenizer, tokens: Sequence[TokenLogprob], before: Sequence[int]) -> dict:
    """``tokens``' log-probabilities in ``/v1/completions``' legacy shape: each token's text, its
    log-probability, its likeliest alternatives as ``{text: logprob}`` and its ``text_offset``,
    where its text starts in the choice's text (``before``: the ids of the choice's tokens
    before these, a stream's earlier chunks')."""
    ids, shape = list(before), {"tokens": [], "token_logprobs": [], "top_logprobs": []}
    offsets = []
    for t in tokens:
        offsets.append(len(tokenizer.decode(ids, skip_special_tokens=True)))
        ids.append(t.token)
        shape["tokens"].append(tokenizer.decode([t.token]))
        shape["token_logprobs"].append(t.logprob)
        shape["top_logprobs"].append({tokenizer.decode([i]): lp for i, lp in t.top})
    return {**shape, "text_offset": offsets}


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _tool_calls(g: Generation) -> list[dict]:
    return [
        {
            "id": _call_id(),
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_text()},
        }
        for c in g.tool_calls
    ]


ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}


# ------------------------------------------------------------------------------- generating
class _Stopped(Exception):
    """Raised in a worker thread by a generation the server stopped; ``error`` answers it."""

    def __init__(self, error: APIError):
        super().__init__(str(error))
        self.error = error


class _Slot:
    """A generating request's place under the concurrency limit, and the way to stop its
    generation: the worker thread calls :meth:`check` with each piece of text, which raises once
    :meth:`stop` has been called (the client left, the server is shutting down)."""

    def __init__(self):
        self.stopped_by: APIError | None = None

    def stop(self, error: APIError) -> None:
        if self.stopped_by is None:
            self.stopped_by = error

    def check(self, piece: object = None) -> None:
        if self.stopped_by is not None:
            raise _Stopped(self.stopped_by)


def _api_error(e: Exception) -> APIError:
    """The error object a request that raised ``e`` is answered with."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, _Stopped):
        return e.error
    if isinstance(e, ClientDisconnect):
        return CLIENT_GONE
    if isinstance(e, BodyError):
        code = {408: "request_timeout", 413: "request_too_large"}.get(e.status)
        return APIError(e.status, str(e), code=code)
    if isinstance(e, RequestError):  # bad content: reserved tokens, a prompt too long, a bad schema
        code = "context_length_exceeded" if "max_model_len" in str(e) else None
        return APIError(400, str(e), code=code)
    if not isinstance(e, EngineFailure):  # the engine loop has logged its own
        log.error("request failed", exc_info=e)
    return APIError(500, f"{type(e).__name__}: {e}", "server_error")


def _answering_errors(endpoint):
    """``endpoint`` with whatever it raises answered by the API's error object."""

    @functools.wraps(endpoint)
    async def answered(request: Request):
        try:
            return await endpoint(request)
        except Exception as e:
            return _api_error(e).response()

    return answered


async def _route_error(request: Request, e: HTTPException) -> JSONResponse:
    """Starlette's routing errors as the API's error object: no route (404), or a method the
    path does not take (405, with the methods it takes)."""
    method, path = request.method, request.url.path
    if e.status_code == 404:
        return APIError(404, f"no route {method} {path}", code="not_found").response()
    if e.status_code != 405:
        return APIError(e.status_code, str(e.detail)).response()
    allowed = (e.headers or {})["Allow"]
    response = APIError(
        405,
        f"method {method} not allowed on {path}; use {' or '.join(sorted(allowed.split(', ')))}",
        code="method_not_allowed",
    ).response()
    response.headers["Allow"] = allowed
    return response


async def _stop_on_disconnect(receive: Receive, slot: _Slot) -> None:
    """Stops ``slot``'s generation when its client disconnects (its body has been read, so what
    ``receive`` gives next is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    slot.stop(CLIENT_GONE)


def _emit(slot: _Slot, sender: ObjectSendStream, loop: EventLoopToken, chunk: dict) -> None:
    """Sends ``chunk`` from any thread to its stream on the event loop ``loop``, or stops the
    generation: the server has stopped it, or the stream's response has ended."""
    slot.check()
    try:
        anyio.from_thread.run_sync(sender.send_nowait, chunk, token=loop)
    except anyio.BrokenResourceError:
        raise _Stopped(CLIENT_GONE) from None


async def _events(first: dict | None, chunks: ObjectReceiveStream):
    """The data of each server-sent event: ``first`` and the rest of ``chunks`` as JSON (an error
    as its error object), then ``[DONE]``."""
    if first is not None:
        yield json.dumps(first, ensure_ascii=False)
    async for chunk in chunks:
        yield json.dumps(chunk.body if isinstance(chunk, APIError) else chunk, ensure_ascii=False)
    yield "[DONE]"


class _EventStream:
    """A streaming request's response (an ASGI app): ``work(emit)`` runs in a worker thread under
    the concurrency limit, and each ``emit(chunk)`` is sent as a server-sent event.  The response
    begins with the first chunk, so that an error before any is answered with its status; an
    error after it is the stream's last event.  ``[DONE]`` follows once the request's slot is
    free, so that a client that has its answer can send its next request at once."""

    def __init__(self, server: OpenAIServer, work: Callable[[Callable[[dict], None]], None]):
        self.server, self.work = server, work

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sender, chunks = anyio.create_memory_object_stream(math.inf)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._produce, receive, sender)
            with chunks:  # closed when the response ends, which stops the work at its next chunk
                first = await anext(chunks, None)
                if isinstance(first, APIError):
                    response = first.response()
                else:
                    response = EventSourceResponse(
                        _events(first, chunks),
                        sep="\n",
                        send_timeout=self.server.limits.read_timeout_s,
                        shutdown_grace_period=self.server._drain_s,
                    )
                try:
                    await response(scope, receive, send)
                except SendTimeoutError:
                    log.info("a client stopped reading its stream; the stream was ended")

    async def _produce(self, receive: Receive, sender: ObjectSendStream) -> None:
        server = self.server
        with sender:
            try:
                with server._generating() as slot:
                    emit = functools.partial(_emit, slot, sender, current_token())
                    await server._in_worker(receive, slot, lambda: self.work(emit))
            except Exception as e:
                with contextlib.suppress(anyio.BrokenResourceError):  # the response has ended
                    sender.send_nowait(_api_error(e))


# ------------------------------------------------------------------------------- the server
class _CountRequests:
    """ASGI middleware: counts each finished HTTP request in ``metrics`` by its route's path
    (``/v1/models/{model}``; ``other`` where no route has the path, so that requests to made-up
    paths cannot grow the label set) and the status it was answered with."""

    def __init__(self, app: ASGIApp, metrics: ServingMetrics, routes: Sequence[Route]):
        self.app, self.metrics, self.routes = app, metrics, routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        matched = (r.path for r in self.routes if r.matches(scope)[0] is not Match.NONE)
        endpoint, status = next(matched, "other"), 500  # 500: raised before answering

        async def sending(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.request_finished(endpoint, status)


class _BearerAuth:
    """ASGI middleware: a request to any path but ``open_paths`` needs ``Authorization: Bearer
    <key>``, compared in constant time (``hmac.compare_digest``), or it is a 401."""

    def __init__(self, app: ASGIApp, key: str, open_paths: frozenset[str]):
        self.app, self.expected, self.open_paths = app, f"Bearer {key}".encode(), open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_paths:
            given = Headers(scope=scope).get("authorization", "").encode("latin-1")
            if not hmac.compare_digest(given, self.expected):
                error = APIError(
                    401,
                    "a valid API key is required: send Authorization: Bearer <key>",
                    code="invalid_api_key",
                )
                await error.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Uvicorn(uvicorn.Server):
    """uvicorn's server with two hooks: ``startup_done``, set once it listens (or has failed
    to), and ``on_shutdown``, called in its event loop as its graceful shutdown begins."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]):
        super().__init__(config)
        self.on_shutdown = on_shutdown
        self.startup_done = threading.Event()

    async def startup(self, sockets=None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.startup_done.set()

    async def shutdown(self, sockets=None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)


@gin.configurable
class OpenAIServer:
    """Serves ``model`` on ``host:port`` (port 0: a free one); ``url`` is the API base URL and
    ``app`` the ASGI application.

    ``api_key``: the bearer token every endpoint but ``/health`` then requires (gin, or
    ``agentic-jax serve --api_key``); ``shutdown_grace_s``: how long :meth:`close` lets the
    requests in flight finish before it stops them; ``tracer_provider``: where the model calls'
    spans go (the process's, set by ``opentelemetry.trace.set_tracer_provider``, by default).
    ``metrics`` are the model's (``ChatModel.metrics``, which its engine loop records), or the
    server's own (its requests alone) for a model that keeps none.  ``embedder``: what
    ``/v1/embeddings`` serves (:class:`Embedder`; ``agentic-jax serve --embedding_checkpoint``
    passes a trained retrieval encoder), listed in ``/v1/models`` beside the model; without one
    that route is a 404 saying how to give one.
    """

    def __init__(
        self,
        model: ChatModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "agentic-jax",
        limits: ServerLimits | None = None,
        api_key: str | None = None,
        shutdown_grace_s: float = 5.0,
        tracer_provider: trace.TracerProvider | None = None,
        embedder: Embedder | None = None,
    ):
        if api_key == "":
            raise ValueError("OpenAIServer.api_key is empty; leave it unset to serve without one")
        if not shutdown_grace_s >= 0:
            raise ValueError(f"OpenAIServer.shutdown_grace_s must be >= 0, got {shutdown_grace_s}")
        self.model, self.model_name, self.embedder = model, model_name, embedder
        self.limits = limits or ServerLimits()
        self.api_key, self.shutdown_grace_s = api_key, shutdown_grace_s
        # Once stopped, a request's last write may wait read_timeout_s for a slow client; after
        # that, uvicorn cancels whatever is left.
        self._drain_s = shutdown_grace_s + self.limits.read_timeout_s
        self.created = int(time.time())
        model_metrics = getattr(model, "metrics", None)
        self.metrics = ServingMetrics() if model_metrics is None else model_metrics
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)
        self._slots: set[_Slot] = set()  # the requests generating; only the event loop uses it
        self._threads = anyio.CapacityLimiter(self.limits.max_concurrent_requests)
        self.app = self._app()
        # Bound now, so that the URL is known before serving begins.
        self._listener = socket.create_server((host, port), backlog=2048)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        config = uvicorn.Config(
            self.app,
            http="h11",  # it takes any method, so that one no path takes is the API's 405
            ws="none",
            lifespan="off",
            log_config=None,  # the application's logging, untouched
            timeout_graceful_shutdown=self._drain_s,
        )
        self._server = _Uvicorn(config, on_shutdown=self._stop_after_grace)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}/v1"

    @property
    def requests_generating(self) -> int:
        """Requests holding a slot under ``max_concurrent_requests`` now."""
        return len(self._slots)

    def start(self) -> OpenAIServer:
        """Serves from a background thread; returns once the server listens."""
        self._thread = threading.Thread(target=self._serve, name="openai-server", daemon=True)
        self._thread.start()
        self._server.startup_done.wait()
        if not self._server.started:
            raise RuntimeError(f"the server at {self.url} failed to start; see the log")
        return self

    def _serve(self) -> None:
        try:
            self._server.run(sockets=[self._listener])
        finally:
            self._server.startup_done.set()

    def serve_forever(self) -> None:
        """Serves from the calling thread until :meth:`close` (from another thread) or, in the
        main thread, SIGINT or SIGTERM, which is raised again once the server has shut down so
        that the caller's own handler sees it."""
        self._server.run(sockets=[self._listener])

    def close(self) -> None:
        """Stops accepting connections, lets the requests in flight finish for
        ``shutdown_grace_s``, stops the rest (a 503 each) and returns once the server is down."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join()
        self._listener.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def _stop_after_grace(self) -> None:
        asyncio.get_running_loop().call_later(self.shutdown_grace_s, self._stop_generating)

    def _stop_generating(self) -> None:
        if self._slots:
            log.warning("shutting down: stopping %d requests still generating", len(self._slots))
        for slot in self._slots:
            slot.stop(SHUTTING_DOWN)

    # ----------------------------------------------------------------------------- routes
    def _app(self) -> Starlette:
        routes = [
            Route("/health", _answering_errors(self._health), methods=["GET"]),
            Route("/metrics", _answering_errors(self._metrics), methods=["GET"]),
            Route("/openapi.json", _answering_errors(self._openapi), methods=["GET"]),
            Route("/v1/models", _answering_errors(self._models), methods=["GET"]),
            Route("/v1/models/{model}", _answering_errors(self._model), methods=["GET"]),
            Route("/v1/chat/completions", _answering_errors(self._chat), methods=["POST"]),
            Route("/v1/completions", _answering_errors(self._completions), methods=["POST"]),
            Route("/v1/embeddings", _answering_errors(self._embeddings), methods=["POST"]),
        ]
        middleware = [Middleware(_CountRequests, metrics=self.metrics, routes=routes)]
        if self.api_key:
            middleware.append(
                Middleware(_BearerAuth, key=self.api_key, open_paths=frozenset({"/health"}))
            )
        return Starlette(
            routes=routes, middleware=middleware, exception_handlers={HTTPException: _route_error}
        )

    @functools.cached_property
    def openapi(self) -> dict:
        """This API as an OpenAPI 3.1 document (``GET /openapi.json``): the request bodies'
        schemas are the request models' own JSON schemas, and every error is the API's error
        object."""
        refs, defs = models_json_schema(
            [
                (ChatCompletionRequest, "validation"),
                (CompletionRequest, "validation"),
                (EmbeddingRequest, "validation"),
            ],
            ref_template="#/components/schemas/{model}",
        )

        def json_content(schema: dict) -> dict:
            return {"application/json": {"schema": schema}}

        error = {
            "description": "the API's error object",
            "content": json_content({"$ref": "#/components/schemas/Error"}),
        }

        def operation(summary: str, reply: str, body=None, **more) -> dict:
            ok = {"description": reply, "content": json_content({"type": "object"})}
            if body is not None:
                if body is not EmbeddingRequest:
                    ok["content"]["text/event-stream"] = {"schema": {"type": "string"}}
                more["requestBody"] = {
                    "required": True,
                    "content": json_content(refs[body, "validation"]),
                }
            return {"summary": summary, "responses": {"200": ok, "default": error}, **more}

        streamed = "the reply; with stream, its chunks as server-sent events, then [DONE]"
        model = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
        document = {
            "openapi": "3.1.0",
            "info": {"title": "agentic-jax: an OpenAI-compatible API", "version": "v1"},
            "paths": {
                "/v1/chat/completions": {
                    "post": operation("the next assistant turn", streamed, ChatCompletionRequest)
                },
                "/v1/completions": {
                    "post": operation("completions of prompts", streamed, CompletionRequest)
                },
                "/v1/embeddings": {
                    "post": operation(
                        "embeddings of texts (404 without an embedding model)",
                        "the embeddings",
                        EmbeddingRequest,
                    )
                },
                "/v1/models": {"get": operation("the models served", "a list")},
                "/v1/models/{model}": {
                    "get": operation("one model", "its card", parameters=[model])
                },
                "/health": {
                    "get": operation("the engine loop's state", "running (503: not)", security=[])
                },
                "/metrics": {
                    "get": {
                        "summary": "the server's and the engine's metrics",
                        "responses": {
                            "200": {
                                "description": "the Prometheus text format",
                                "content": {"text/plain": {"schema": {"type": "string"}}},
                            },
                            "default": error,
                        },
                    }
                },
                "/openapi.json": {"get": operation("this document", "OpenAPI 3.1")},
            },
            "components": {"schemas": {**defs["$defs"], "Error": ERROR_SCHEMA}},
        }
        if self.api_key:
            document["components"]["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}
            }
            document["security"] = [{"bearer": []}]
        return document

    async def _openapi(self, request: Request) -> JSONResponse:
        return JSONResponse(self.openapi)

    async def _metrics(self, request: Request) -> Response:
        body, content_type = self.metrics.exposition()
        return Response(body, headers={"Content-Type": content_type})

    async def _health(self, request: Request) -> JSONResponse:
        loop = self.model.loop.health()
        if loop["engine_loop"] == "running":
            return JSONResponse({"status": "ok", **loop})
        return JSONResponse(
            {"status": "unavailable", **loop}, status_code=503, headers={"Retry-After": "1"}
        )

    @property
    def _served(self) -> list[str]:
        """The models' names: the chat model's, then the embedder's if there is one."""
        return [self.model_name] + ([self.embedder.name] if self.embedder else [])

    def _model_card(self, name: str) -> dict:
        return {"id": name, "object": "model", "created": self.created, "owned_by": "agentic-jax"}

    def _check_model(self, name: str, served: str) -> None:
        if name != served:
            raise APIError(
                404,
                f"the model {name!r} does not exist; this endpoint serves {served!r}",
                param="model",
                code="model_not_found",
            )

    async def _models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": list(map(self._model_card, self._served))})

    async def _model(self, request: Request) -> JSONResponse:
        name = request.path_params["model"]
        if name not in self._served:
            self._check_model(name, self.model_name)
        return JSONResponse(self._model_card(name))

    async def _parse(self, request: Request, cls, served: str | None = None):
        limits = self.limits
        raw = await read_body(
            request.receive,
            request.headers.get("content-length"),
            max_bytes=limits.max_request_bytes,
            timeout_s=limits.read_timeout_s,
        )
        body = (
            parse_json_body(
                raw, max_bytes=limits.max_request_bytes, max_depth=limits.max_json_depth
            )
            if raw
            else None
        )
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            parsed = cls.model_validate(body)
        except pydantic.ValidationError as e:
            raise _validation_error(e) from None
        self._check_model(parsed.model, served or self.model_name)
        parsed.check(limits)
        return parsed

    # ----------------------------------------------------------------------------- generating
    @contextlib.contextmanager
    def _generating(self):
        """A slot under the concurrency limit for one generating request (a 503 at once when
        none is free), freed on leaving."""
        if len(self._slots) >= self.limits.max_concurrent_requests:
            raise APIError(
                503,
                f"the server is busy: {self.limits.max_concurrent_requests} "
                f"requests are generating; retry shortly",
                "server_error",
                code="server_busy",
            )
        slot = _Slot()
        self._slots.add(slot)
        try:
            yield slot
        finally:
            self._slots.discard(slot)

    async def _in_worker(self, receive: Receive, slot: _Slot, fn: Callable[[], Any]) -> Any:
        """``fn()`` in a worker thread (the engine's calls block), with ``slot`` stopped if the
        client disconnects meanwhile."""
        error = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_stop_on_disconnect, receive, slot)
            try:
                result = await anyio.to_thread.run_sync(fn, limiter=self._threads)
            except Exception as e:  # raised below: the task group would wrap it in a group
                error = e
            tg.cancel_scope.cancel()
        if error is not None:
            raise error
        return result

    def _chunk(self, kind: str, id_: str, choice: dict, usage: dict | None = None) -> dict:
        body = {
            "id": id_,
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice] if choice else [],
        }
        if usage is not None:
            body["usage"] = usage
        return body

    @staticmethod
    def _all(fn, jobs: list) -> list:
        """``fn(job)`` for every job, batched by the engine; a bounded pool keeps a long list
        from costing a thread each."""
        if len(jobs) == 1:
            return [fn(jobs[0])]
        with concurrent.futures.ThreadPoolExecutor(min(len(jobs), PROMPT_THREADS)) as pool:
            return list(pool.map(fn, jobs))

    def _traced(
        self, operation: str, r: _Sampling, id_: str, generate: Callable[[], list[Generation]]
    ) -> list[Generation]:
        """``generate()``, one request's generations, in an OpenTelemetry span named and
        attributed by the GenAI semantic conventions: ``{operation} {model}``, the request's
        settings, then the reply's id, finish reasons and token usage (an exception is recorded
        on it).  Its kind is internal: the model runs in this process."""
        attributes = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": "agentic_jax",
            "gen_ai.request.model": self.model_name,
            "gen_ai.request.temperature": r.temperature,
            "gen_ai.request.top_p": r.top_p,
            "gen_ai.response.id": id_,
        }
        optional = {
            "gen_ai.request.max_tokens": r.requested_max_tokens,
            "gen_ai.request.seed": r.seed,
            "gen_ai.request.choice.count": r.n if r.n != 1 else None,
        }
        attributes.update({k: v for k, v in optional.items() if v is not None})
        name = f"{operation} {self.model_name}"
        with self._tracer.start_as_current_span(name, attributes=attributes) as span:
            done = generate()
            span.set_attributes(
                {
                    "gen_ai.response.model": self.model_name,
                    "gen_ai.response.finish_reasons": [g.finish_reason for g in done],
                    "gen_ai.usage.input_tokens": sum(g.prompt_tokens for g in done),
                    "gen_ai.usage.output_tokens": sum(g.completion_tokens for g in done),
                }
            )
        return done

    def _streamed(self, operation: str, kind: str, r: _Sampling, id_: str, choices: list):
        """A streamed reply: every ``choice(emit)``, which streams its own chunks, batched by the
        engine in one span; then, if asked for, the usage in a chunk of its own."""

        def work(emit: Callable[[dict], None]) -> None:
            done = self._traced(operation, r, id_, lambda: self._all(lambda c: c(emit), choices))
            if r.include_usage:
                emit(self._chunk(kind, id_, {}, _usage(done)))

        return _EventStream(self, work)

    async def _chat(self, request: Request):
        r = await self._parse(request, ChatCompletionRequest)
        messages = [_message(m) for m in r.messages]
        specs = [
            ToolSpec(t.function.name, t.function.description, t.function.parameters)
            for t in r.tools or ()
        ]
        chat = functools.partial(
            self.model.chat,
            messages,
            specs,
            tool_choice=r.tool_choice or "auto",
            parallel_tool_calls=r.parallel_tool_calls,
            strict_max_tokens=r.requested_max_tokens is not None,
            response_format=r.response_format,
            top_logprobs=r.top_logprobs or 0,
        )
        params = [r.params(i) for i in range(r.n)]
        id_ = f"chatcmpl-{uuid.uuid4().hex}"
        if r.stream:
            choices = [
                functools.partial(self._stream_chat_choice, chat, p, i, id_, r.logprobs)
                for i, p in enumerate(params)
            ]
            return self._streamed("chat", "chat.completion.chunk", r, id_, choices)
        with self._generating() as slot:
            done = await self._in_worker(
                request.receive,
                slot,
                lambda: self._traced(
                    "chat",
                    r,
                    id_,
                    lambda: self._all(
                        lambda p: chat(params=p, on_text=slot.check, on_tool_call=slot.check),
                        params,
                    ),
                ),
            )
        choices = []
        for i, g in enumerate(done):
            calls = _tool_calls(g)
            message = {"role": "assistant", "content": g.text or (None if calls else "")}
            if calls:
                message["tool_calls"] = calls
            choices.append(
                {
                    "index": i,
                    "message": message,
                    "logprobs": self.model.openai_logprobs(g) if r.logprobs else None,
                    "finish_reason": g.finish_reason,
                }
            )
        return JSONResponse(
            {
                "id": id_,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": choices,
                "usage": _usage(done),
            }
        )

    def _stream_chat_choice(
        self, chat, params, index: int, id_: str, logprobs: bool, emit
    ) -> Generation:
        """One streamed chat choice, run in a worker thread: the role, the text as it comes
        (each piece with its tokens' log-probabilities, when asked for), each tool call as the
        API's deltas as it is decoded (its index, id, type and name with empty arguments, then
        each piece of its arguments), the finish reason (with the log-probabilities of tokens
        whose text never came: a stop string's)."""

        def delta(content: dict, finish: str | None = None, tokens=()) -> dict:
            choice = {
                "index": index,
                "delta": content,
                "logprobs": self.model.openai_logprobs(tokens) if logprobs and tokens else None,
                "finish_reason": finish,
            }
            return self._chunk("chat.completion.chunk", id_, choice)

        pending: list[TokenLogprob] = []  # tokens whose text has not been sent yet
        opened, sent = False, 0

        def open_message(content: str | None) -> None:
            nonlocal opened
            if not opened:
                emit(delta({"role": "assistant", "content": content}))
                opened = True

        def on_text(text: str) -> None:
            nonlocal sent
            open_message("")
            if text:
                emit(delta({"content": text}, tokens=pending))
                sent += len(pending)
                pending.clear()

        def on_tool_call(piece: ToolCallDelta) -> None:
            open_message(None)  # no text before the calls: null content, as unstreamed
            if piece.name is None:
                call = {"index": piece.index, "function": {"arguments": piece.arguments}}
            else:  # the call opens with empty arguments: what a client appends the pieces to
                call = {
                    "index": piece.index,
                    "id": _call_id(),
                    "type": "function",
                    "function": {"name": piece.name, "arguments": ""},
                }
            emit(delta({"tool_calls": [call]}))

        g = chat(params=params, on_text=on_text, on_tool_call=on_tool_call, on_token=pending.append)
        on_text("")  # opens the stream if no text came
        emit(delta({}, g.finish_reason, g.logprobs[sent:]))
        return g

    async def _completions(self, request: Request):
        r = await self._parse(request, CompletionRequest)
        # Log-probabilities are asked of the model only for a request that wants them.
        asked = {} if r.logprobs is None else {"top_logprobs": r.logprobs}
        complete = functools.partial(
            self.model.complete, strict_max_tokens=r.requested_max_tokens is not None, **asked
        )
        id_ = f"cmpl-{uuid.uuid4().hex}"
        # Choice p * n + i is sample i of prompt p, as the OpenAI API numbers them.
        jobs = [(p, r.params(i)) for p in r.prompts for i in range(r.n)]
        if r.stream:
            choices = [
                functools.partial(
                    self._stream_completion_choice, complete, *job, i, id_, r.logprobs
                )
                for i, job in enumerate(jobs)
            ]
            return self._streamed("text_completion", "text_completion", r, id_, choices)
        with self._generating() as slot:
            done = await self._in_worker(
                request.receive,
                slot,
                lambda: self._traced(
                    "text_completion",
                    r,
                    id_,
                    lambda: self._all(lambda job: complete(*job, slot.check), jobs),
                ),
            )
        return JSONResponse(
            {
                "id": id_,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "usage": _usage(done),
                "choices": [
                    {
                        "index": i,
                        "text": g.text,
                        "logprobs": None
                        if r.logprobs is None
                        else _completion_logprobs(self.model.tokenizer, g.logprobs, ()),
                        "finish_reason": g.finish_reason,
                    }
                    for i, g in enumerate(done)
                ],
            }
        )

    def _stream_completion_choice(
        self, complete, prompt: str, params, index: int, id_: str, logprobs: int | None, emit
    ) -> Generation:
        """One streamed completion choice, run in a worker thread: its text as it comes (each
        piece with its tokens' log-probabilities, when asked for), then its finish reason."""
        pending: list[TokenLogprob] = []  # tokens whose text has not been sent yet
        sent: list[int] = []  # the ids of those whose log-probabilities have been

        def piece(text: str, finish: str | None = None, tokens=()) -> dict:
            shape = None
            if logprobs is not None:
                shape = _completion_logprobs(self.model.tokenizer, tokens, sent)
                sent.extend(t.token for t in tokens)
            choice = {"index": index, "text": text, "logprobs": shape, "finish_reason": finish}
            return self._chunk("text_completion", id_, choice)

        def on_text(text: str) -> None:
            emit(piece(text, tokens=pending))
            pending.clear()

        hooks = {} if logprobs is None else {"on_token": pending.append}
        g = complete(prompt, params, on_text, **hooks)
        emit(piece("", g.finish_reason, g.logprobs[len(sent) :]))
        return g

    async def _embeddings(self, request: Request) -> JSONResponse:
        embedder = self.embedder
        if embedder is None:
            raise APIError(
                404,
                "this server has no embedding model: serve one beside the chat model with "
                "agentic-jax serve --embedding_checkpoint DIR (a trained retrieval encoder's "
                "run) or OpenAIServer(embedder=...)",
                code="embeddings_not_configured",
            )
        r = await self._parse(request, EmbeddingRequest, embedder.name)
        width = embedder.dimension if r.dimensions is None else r.dimensions
        if width != embedder.dimension and width not in embedder.matryoshka_dimensions:
            shorter = embedder.matryoshka_dimensions
            also = f", or its Matryoshka prefixes {list(shorter)}" if shorter else ""
            raise APIError(
                400,
                f"dimensions={width}: {embedder.name!r} makes embeddings of "
                f"{embedder.dimension}{also}",
                param="dimensions",
            )
        with self._generating() as slot:
            done = await self._in_worker(request.receive, slot, lambda: embedder.embed(r.inputs))
        vectors = np.asarray(done.vectors, np.float32)
        if width != embedder.dimension:
            vectors = _matryoshka_prefix(vectors, width)
        data = [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v.astype("<f4").tobytes()).decode()
                if r.encoding_format == "base64"
                else v.tolist(),
            }
            for i, v in enumerate(vectors)
        ]
        usage = {"prompt_tokens": done.prompt_tokens, "total_tokens": done.prompt_tokens}
        return JSONResponse(
            {"object": "list", "data": data, "model": embedder.name, "usage": usage}
        )
