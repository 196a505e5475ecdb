"""An OpenAI-compatible HTTP API over a checkpoint (``agentic-jax serve``).

Endpoints: ``POST /v1/chat/completions`` (messages, tools, ``tool_choice``, ``n``, streaming),
``POST /v1/completions`` (a prompt or a list of prompts), ``GET /v1/models``, ``GET /health``.
Anything that speaks the OpenAI API (the ``openai`` client, LangGraph/LangChain's ``ChatOpenAI``,
smolagents' ``OpenAIServerModel``, the OpenAI Agents SDK, :class:`HTTPPolicy`) can then use an
agentic-jax model.

Built on the standard library's threading HTTP server: each request gets a thread, and all of them
feed one :class:`EngineLoop`, so concurrent requests are batched continuously by the engine.
Streaming uses server-sent events over chunked transfer encoding, ending with ``data: [DONE]``.

**No request can take the server down.**  Every field has a range the engine can hold, and the
limits of :class:`ServerLimits` (gin) bound what one request may ask for.  The client's mistakes
get the API's error object (``{"error": {"message", "type", "param", "code"}}``) with a 4xx:
undecodable bytes, invalid or too deeply nested JSON and out-of-range fields a 400, a body over
the size limit a 413, an unknown path a 404, a method a path does not take a 405, too many
requests at once a 503 with ``Retry-After``.  A failure of the server's own (the engine failed
while serving the request) is a 500 for that request alone; the engine loop resets and serves
the next one, and ``/health`` reports its state (503 while it is not running).  A client that
disconnects mid-stream ends its generation: the next write fails, and the request is aborted in
the engine, freeing its slot.  A non-streaming request runs to completion whether or not its
client is still there.  Not supported: streaming with ``n > 1``, logprobs, images.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import gin
import pydantic

from agentic_jax.data.chat import Message, ToolCall, ToolSpec
from agentic_jax.inference.decoding.sampling import INT32_MAX, SEED_RANGE
from agentic_jax.inference.errors import EngineFailure, RequestError
from agentic_jax.inference.serving.chat_model import ChatModel, Generation, sampling_params
from agentic_jax.inference.serving.request_body import BodyError, check_size, parse_json_body

log = logging.getLogger(__name__)
PROMPT_THREADS = 16  # most generations of one request in flight at once


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one request may ask of :class:`OpenAIServer`.

    ``max_request_bytes``: the body (413 above it); ``max_json_depth``: nesting of the JSON body;
    ``max_messages``, ``max_tools``, ``max_prompts`` (of one ``/v1/completions`` request), ``max_n``
    (choices per prompt), ``max_stop`` stop strings of at most ``max_stop_chars`` characters each;
    ``max_concurrent_requests`` generating at once (503 beyond); ``read_timeout_s``: how long a
    connection may stall while sending or receiving.
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


# ------------------------------------------------------------------------------- request schemas
class _Request(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="ignore")


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
        if self.stream and self.n > 1:
            raise APIError(400, "streaming supports n=1", param="n")


class ChatCompletionRequest(_Sampling):
    messages: list[_MessageIn] = pydantic.Field(min_length=1)
    tools: list[_ToolIn] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    max_completion_tokens: int | None = pydantic.Field(None, ge=1, le=INT32_MAX)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def check(self, limits: ServerLimits) -> None:
        super().check(limits)
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


class CompletionRequest(_Sampling):
    prompt: str | list[str]

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else self.prompt

    def check(self, limits: ServerLimits) -> None:
        super().check(limits)
        if not self.prompts:
            raise APIError(400, "prompt must not be empty", param="prompt")
        if len(self.prompts) > limits.max_prompts:
            raise APIError(
                400, f"{len(self.prompts)} prompts: at most {limits.max_prompts}", param="prompt"
            )
        if self.stream and len(self.prompts) != 1:
            raise APIError(400, "streaming supports one prompt", param="prompt")


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
    return APIError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param)


# ------------------------------------------------------------------------------- responses
def _usage(g: Generation) -> dict:
    return {
        "prompt_tokens": g.prompt_tokens,
        "completion_tokens": g.completion_tokens,
        "total_tokens": g.prompt_tokens + g.completion_tokens,
    }


def _tool_calls(g: Generation) -> list[dict]:
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": c.arguments_text()},
        }
        for c in g.tool_calls
    ]


class OpenAIServer:
    """Serves ``model`` on ``host:port`` (port 0: a free one); ``url`` is the API base URL."""

    def __init__(
        self,
        model: ChatModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        model_name: str = "agentic-jax",
        limits: ServerLimits | None = None,
    ):
        self.model, self.model_name = model, model_name
        self.limits = limits or ServerLimits()
        self.created = int(time.time())
        self._generating = threading.BoundedSemaphore(self.limits.max_concurrent_requests)
        handler = type("Handler", (_Handler,), {"api": self, "timeout": self.limits.read_timeout_s})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> OpenAIServer:
        """Serves from a background thread."""
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="openai-server", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    # ----------------------------------------------------------------------------- routes
    def route(self, method: str, path: str):
        path = path.split("?", 1)[0].rstrip("/")
        routes = {
            ("GET", "/health"): self._health,
            ("GET", "/v1/models"): self._models,
            ("GET", f"/v1/models/{self.model_name}"): lambda h, body: h.send_json(
                200, self._model_card()
            ),
            ("POST", "/v1/chat/completions"): self._generating_route(self._chat),
            ("POST", "/v1/completions"): self._generating_route(self._completions),
        }
        if (method, path) in routes:
            return routes[method, path]
        allowed = sorted(m for m, p in routes if p == path)
        if allowed:
            raise APIError(
                405,
                f"method {method} not allowed on {path}; use {' or '.join(allowed)}",
                code="method_not_allowed",
            )
        raise APIError(404, f"no route {method} {path}", code="not_found")

    def _generating_route(self, fn):
        """``fn`` behind the concurrency limit: a request over it is a 503 at once."""

        @functools.wraps(fn)
        def limited(h: _Handler, body) -> None:
            if not self._generating.acquire(blocking=False):
                raise APIError(
                    503,
                    f"the server is busy: {self.limits.max_concurrent_requests} "
                    f"requests are generating; retry shortly",
                    "server_error",
                    code="server_busy",
                )
            # Freed before the response's last bytes go out (`_Handler.finish_generating`), so a
            # client that has its answer can send the next request at once.
            h.finish_generating = _Slot(self._generating).release
            try:
                fn(h, body)
            finally:
                h.finish_generating()
                h.finish_generating = _nothing

        return limited

    def _health(self, h: _Handler, body) -> None:
        loop = self.model.loop.health()
        up = loop["engine_loop"] == "running"
        h.send_json(200 if up else 503, {"status": "ok" if up else "unavailable", **loop})

    def _model_card(self) -> dict:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "agentic-jax",
        }

    def _models(self, h: _Handler, body) -> None:
        h.send_json(200, {"object": "list", "data": [self._model_card()]})

    def _parse(self, cls, body):
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            request = cls.model_validate(body)
        except pydantic.ValidationError as e:
            raise _validation_error(e) from None
        if request.model != self.model_name:
            raise APIError(
                404,
                f"the model {request.model!r} does not exist; this server has {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        request.check(self.limits)
        return request

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

    def _chat(self, h: _Handler, body) -> None:
        r = self._parse(ChatCompletionRequest, body)
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
            strict_max_tokens=r.requested_max_tokens is not None,
        )
        id_ = f"chatcmpl-{uuid.uuid4().hex}"
        if r.stream:
            self._chat_stream(h, r, chat, id_)
            return
        done = self._all(lambda i: chat(params=r.params(i)), list(range(r.n)))
        choices = []
        for i, g in enumerate(done):
            calls = _tool_calls(g)
            message = {"role": "assistant", "content": g.text or (None if calls else "")}
            if calls:
                message["tool_calls"] = calls
            choices.append(
                {"index": i, "message": message, "logprobs": None, "finish_reason": g.finish_reason}
            )
        h.send_json(
            200,
            {
                "id": id_,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_name,
                "choices": choices,
                "usage": _total(done),
            },
        )

    def _chat_stream(self, h: _Handler, r: ChatCompletionRequest, chat, id_: str) -> None:
        stream = _LazyStream(h)

        def delta(content: dict, finish: str | None = None) -> dict:
            return self._chunk(
                "chat.completion.chunk",
                id_,
                {"index": 0, "delta": content, "finish_reason": finish},
            )

        def on_text(text: str) -> None:
            if not stream.started:
                stream.send(delta({"role": "assistant", "content": ""}))
            if text:
                stream.send(delta({"content": text}))

        g = chat(params=r.params(), on_text=on_text)
        on_text("")  # opens the stream if no text came
        calls = _tool_calls(g)
        if calls:
            stream.send(delta({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}))
        stream.send(delta({}, g.finish_reason))
        if r.include_usage:
            stream.send(self._chunk("chat.completion.chunk", id_, {}, _usage(g)))
        stream.close()

    def _completions(self, h: _Handler, body) -> None:
        r = self._parse(CompletionRequest, body)
        complete = functools.partial(
            self.model.complete, strict_max_tokens=r.requested_max_tokens is not None
        )
        id_ = f"cmpl-{uuid.uuid4().hex}"
        if r.stream:
            stream = _LazyStream(h)
            g = complete(
                r.prompt if isinstance(r.prompt, str) else r.prompt[0],
                r.params(),
                lambda d: stream.send(
                    self._chunk(
                        "text_completion",
                        id_,
                        {"index": 0, "text": d, "logprobs": None, "finish_reason": None},
                    )
                ),
            )
            stream.send(
                self._chunk(
                    "text_completion",
                    id_,
                    {"index": 0, "text": "", "logprobs": None, "finish_reason": g.finish_reason},
                    _usage(g) if r.include_usage else None,
                )
            )
            stream.close()
            return
        # Choice p * n + i is sample i of prompt p, as the OpenAI API numbers them.
        jobs = [(p, i) for p in r.prompts for i in range(r.n)]
        done = self._all(lambda job: complete(job[0], r.params(job[1])), jobs)
        h.send_json(
            200,
            {
                "id": id_,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
                "usage": _total(done),
                "choices": [
                    {"index": i, "text": g.text, "logprobs": None, "finish_reason": g.finish_reason}
                    for i, g in enumerate(done)
                ],
            },
        )


def _total(done: list[Generation]) -> dict:
    usages = [_usage(g) for g in done]
    return {k: sum(u[k] for u in usages) for k in usages[0]}


class _Slot:
    """A generating request's place under the concurrency limit, freed once."""

    def __init__(self, semaphore: threading.BoundedSemaphore):
        self.semaphore, self.held = semaphore, True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.semaphore.release()


def _nothing() -> None:
    pass


class _LazyStream:
    """Server-sent events over chunked encoding, started by the first event, so that an error
    before any output can still be answered with a proper status."""

    def __init__(self, handler: _Handler):
        self.handler, self.started = handler, False
        handler.stream = self

    def _write(self, data: bytes) -> None:
        self.handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.handler.wfile.flush()

    def send(self, event: dict | str) -> None:
        if not self.started:
            h = self.handler
            h.send_response(200)
            h.send_header("Content-Type", "text/event-stream")
            h.send_header("Cache-Control", "no-cache")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            self.started = True
        text = event if isinstance(event, str) else json.dumps(event, ensure_ascii=False)
        self._write(f"data: {text}\n\n".encode())

    def close(self) -> None:
        self.handler.finish_generating()
        self.send("[DONE]")
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()


class _Handler(BaseHTTPRequestHandler):
    """Routes every method (``do_GET``, ``do_PUT``, any other) through :meth:`_handle`, so a
    method a path does not take is the API's 405, not the HTTP layer's 501."""

    protocol_version = "HTTP/1.1"
    api: OpenAIServer
    stream: _LazyStream | None = None
    finish_generating = staticmethod(_nothing)  # frees a generating request's slot

    def __getattr__(self, name: str):
        if name.startswith("do_"):
            return functools.partial(self._handle, name[3:])
        raise AttributeError(name)

    def send_json(self, status: int, body: dict) -> None:
        self.finish_generating()
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 503:
            self.send_header("Retry-After", "1")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _fail(self, error: APIError) -> None:
        """The error object as the response, or as the last event of a started stream."""
        try:
            if self.stream is not None and self.stream.started:
                self.stream.send(error.body)
                self.stream.close()
            else:
                self.send_json(error.status, error.body)
        except OSError:  # the client is gone too
            self.close_connection = True

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            # Not decoded here: the unread chunks would be taken for the next request.
            self.close_connection = True
            raise APIError(411, "a Content-Length is required (chunked bodies are not accepted)")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            # Where this body ends is unknown, so the next request on the connection cannot be
            # found (and a negative length would read until the client hangs up): close it.
            self.close_connection = True
            raise APIError(400, f"invalid Content-Length {self.headers['Content-Length']!r}")
        try:
            check_size(length, self.api.limits.max_request_bytes)
        except BodyError:
            self.close_connection = True  # the body is not read: the connection cannot be reused
            raise
        return self.rfile.read(length) if length else b""

    def _handle(self, method: str) -> None:
        self.stream = None
        try:
            raw = self._body()
            handler = self.api.route(method, self.path)
            limits = self.api.limits
            body = (
                parse_json_body(
                    raw, max_bytes=limits.max_request_bytes, max_depth=limits.max_json_depth
                )
                if raw
                else None
            )
            handler(self, body)
        except APIError as e:
            self._fail(e)
        except BodyError as e:
            self._fail(
                APIError(e.status, str(e), code="request_too_large" if e.status == 413 else None)
            )
        except RequestError as e:  # bad content: reserved tokens, a prompt too long, a bad schema
            code = "context_length_exceeded" if "max_model_len" in str(e) else None
            self._fail(APIError(400, str(e), code=code))
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            log.info("client went away")
            self.close_connection = True
        except Exception as e:
            if not isinstance(e, EngineFailure):  # the engine loop has logged its own
                log.exception("request failed")
            self._fail(APIError(500, f"{type(e).__name__}: {e}", "server_error"))

    def log_message(self, format, *args):
        log.info("%s - %s", self.address_string(), format % args)
