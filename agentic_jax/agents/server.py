"""An OpenAI-compatible HTTP API over a checkpoint (``agentic-jax serve``).

Endpoints: ``POST /v1/chat/completions`` (messages, tools, ``tool_choice``, streaming),
``POST /v1/completions`` (a prompt or a list of prompts), ``GET /v1/models``, ``GET /health``.
Anything that speaks the OpenAI API (the ``openai`` client, LangGraph/LangChain's ``ChatOpenAI``,
smolagents' ``OpenAIServerModel``, the OpenAI Agents SDK, :class:`HTTPPolicy`) can then use an
agentic-jax model.

Built on the standard library's threading HTTP server: each request gets a thread, and all of them
feed one :class:`EngineLoop`, so concurrent requests are batched continuously by the engine.
Streaming uses server-sent events over chunked transfer encoding, ending with ``data: [DONE]``.
Bad requests get the API's error object (``{"error": {"message", "type", "param", "code"}}``)
with a 4xx status; unexpected failures a 500 with the same shape; the server keeps running.
A client that disconnects mid-stream ends its generation: the next write fails, and the request
is aborted in the engine, freeing its slot.  A non-streaming request runs to completion whether
or not its client is still there.  Not supported: ``n > 1``, logprobs, images.
"""
from __future__ import annotations

import concurrent.futures
import json
import logging
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import pydantic

from agentic_jax.agents.chat_model import ChatModel, Generation, RequestError, sampling_params
from agentic_jax.agents.tools import ToolSpec
from agentic_jax.data.chat import Message, ToolCall

log = logging.getLogger(__name__)
PROMPT_THREADS = 16  # most prompts of one /v1/completions request in flight at once


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, {"error": {"message": message, "type": type_,
                                                    "param": param, "code": code}}


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


class _MessageIn(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
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
    max_tokens: int | None = pydantic.Field(None, ge=1)
    temperature: float = pydantic.Field(1.0, ge=0, le=2)
    top_p: float = pydantic.Field(1.0, gt=0, le=1)
    frequency_penalty: float = pydantic.Field(0.0, ge=-2, le=2)
    presence_penalty: float = pydantic.Field(0.0, ge=-2, le=2)
    seed: int | None = None
    stop: str | list[str] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None

    def params(self, max_tokens: int | None = None):
        try:
            return sampling_params(temperature=self.temperature, top_p=self.top_p,
                                   max_tokens=max_tokens or self.max_tokens, seed=self.seed,
                                   stop=self.stop, frequency_penalty=self.frequency_penalty,
                                   presence_penalty=self.presence_penalty)
        except ValueError as e:  # e.g. an empty stop string
            raise APIError(400, str(e)) from None

    @property
    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class ChatCompletionRequest(_Sampling):
    messages: list[_MessageIn] = pydantic.Field(min_length=1)
    tools: list[_ToolIn] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None
    max_completion_tokens: int | None = pydantic.Field(None, ge=1)


class CompletionRequest(_Sampling):
    prompt: str | list[str]


def _text(content) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text":
            raise APIError(400, f"unsupported content part type {part.get('type')!r}",
                           param="messages")
        parts.append(part.get("text", ""))
    return "".join(parts)


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
    return {"prompt_tokens": g.prompt_tokens, "completion_tokens": g.completion_tokens,
            "total_tokens": g.prompt_tokens + g.completion_tokens}


def _tool_calls(g: Generation) -> list[dict]:
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments_text()}}
            for c in g.tool_calls]


class OpenAIServer:
    """Serves ``model`` on ``host:port`` (port 0: a free one); ``url`` is the API base URL."""

    def __init__(self, model: ChatModel, *, host: str = "127.0.0.1", port: int = 0,
                 model_name: str = "agentic-jax"):
        self.model, self.model_name = model, model_name
        self.created = int(time.time())
        handler = type("Handler", (_Handler,), {"api": self})
        self.httpd = ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "OpenAIServer":
        """Serves from a background thread."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="openai-server",
                                        daemon=True)
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
        routes = {("GET", "/health"): lambda h, body: h.send_json(200, {"status": "ok"}),
                  ("GET", "/v1/models"): self._models,
                  ("POST", "/v1/chat/completions"): self._chat,
                  ("POST", "/v1/completions"): self._completions}
        if (method, path) in routes:
            return routes[method, path]
        if method == "GET" and path == f"/v1/models/{self.model_name}":
            return lambda h, body: h.send_json(200, self._model_card())
        if any(p == path for _, p in routes):
            raise APIError(405, f"method {method} not allowed on {path}")
        raise APIError(404, f"no route {method} {path}", code="not_found")

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created,
                "owned_by": "agentic-jax"}

    def _models(self, h: "_Handler", body) -> None:
        h.send_json(200, {"object": "list", "data": [self._model_card()]})

    def _parse(self, cls, body):
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        try:
            request = cls.model_validate(body)
        except pydantic.ValidationError as e:
            raise _validation_error(e) from None
        if request.model != self.model_name:
            raise APIError(404, f"the model {request.model!r} does not exist; this server has "
                                f"{self.model_name!r}", param="model", code="model_not_found")
        return request

    def _chunk(self, kind: str, id_: str, choice: dict, usage: dict | None = None) -> dict:
        body = {"id": id_, "object": kind, "created": int(time.time()), "model": self.model_name,
                "choices": [choice] if choice else []}
        if usage is not None:
            body["usage"] = usage
        return body

    def _chat(self, h: "_Handler", body) -> None:
        r = self._parse(ChatCompletionRequest, body)
        messages = [_message(m) for m in r.messages]
        specs = [ToolSpec(t.function.name, t.function.description, t.function.parameters)
                 for t in r.tools or ()]
        params, id_ = r.params(r.max_completion_tokens), f"chatcmpl-{uuid.uuid4().hex}"
        if r.stream:
            self._chat_stream(h, r, messages, specs, params, id_)
            return
        g = self.model.chat(messages, specs, tool_choice=r.tool_choice or "auto", params=params)
        calls = _tool_calls(g)
        message = {"role": "assistant", "content": g.text or (None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        h.send_json(200, {**self._chunk("chat.completion", id_, {
            "index": 0, "message": message, "logprobs": None,
            "finish_reason": g.finish_reason}), "usage": _usage(g)})

    def _chat_stream(self, h: "_Handler", r: ChatCompletionRequest, messages, specs, params,
                     id_: str) -> None:
        stream = _LazyStream(h)

        def delta(content: dict, finish: str | None = None) -> dict:
            return self._chunk("chat.completion.chunk", id_, {"index": 0, "delta": content,
                                                              "finish_reason": finish})

        def on_text(text: str) -> None:
            if not stream.started:
                stream.send(delta({"role": "assistant", "content": ""}))
            if text:
                stream.send(delta({"content": text}))

        g = self.model.chat(messages, specs, tool_choice=r.tool_choice or "auto", params=params,
                            on_text=on_text)
        on_text("")  # opens the stream if no text came
        calls = _tool_calls(g)
        if calls:
            stream.send(delta({"tool_calls": [{"index": i, **c} for i, c in enumerate(calls)]}))
        stream.send(delta({}, g.finish_reason))
        if r.include_usage:
            stream.send(self._chunk("chat.completion.chunk", id_, {}, _usage(g)))
        stream.close()

    def _completions(self, h: "_Handler", body) -> None:
        r = self._parse(CompletionRequest, body)
        prompts = [r.prompt] if isinstance(r.prompt, str) else r.prompt
        if not prompts:
            raise APIError(400, "prompt must not be empty", param="prompt")
        params, id_ = r.params(), f"cmpl-{uuid.uuid4().hex}"
        if r.stream:
            if len(prompts) != 1:
                raise APIError(400, "streaming supports one prompt", param="prompt")
            stream = _LazyStream(h)
            g = self.model.complete(prompts[0], params, on_text=lambda d: stream.send(
                self._chunk("text_completion", id_, {"index": 0, "text": d, "logprobs": None,
                                                     "finish_reason": None})))
            stream.send(self._chunk("text_completion", id_, {
                "index": 0, "text": "", "logprobs": None, "finish_reason": g.finish_reason},
                _usage(g) if r.include_usage else None))
            stream.close()
            return
        # Batched by the engine; the pool's bound keeps a long prompt list from costing a thread
        # per prompt.
        with concurrent.futures.ThreadPoolExecutor(min(len(prompts), PROMPT_THREADS)) as pool:
            done = list(pool.map(lambda p: self.model.complete(p, params), prompts))
        usage = {k: sum(_usage(g)[k] for g in done) for k in _usage(done[0])}
        h.send_json(200, {"id": id_, "object": "text_completion", "created": int(time.time()),
                          "model": self.model_name, "usage": usage, "choices": [
                              {"index": i, "text": g.text, "logprobs": None,
                               "finish_reason": g.finish_reason} for i, g in enumerate(done)]})


class _LazyStream:
    """Server-sent events over chunked encoding, started by the first event, so that an error
    before any output can still be answered with a proper status."""

    def __init__(self, handler: "_Handler"):
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
        self.send("[DONE]")
        self.handler.wfile.write(b"0\r\n\r\n")
        self.handler.wfile.flush()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    api: OpenAIServer
    stream: _LazyStream | None = None

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def _fail(self, error: APIError) -> None:
        """The error object as the response, or as the last event of a started stream."""
        if self.stream is not None and self.stream.started:
            self.stream.send(error.body)
            self.stream.close()
        else:
            self.send_json(error.status, error.body)

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
        return self.rfile.read(length) if length else b""

    def _handle(self, method: str) -> None:
        self.stream = None
        try:
            raw = self._body()
            handler = self.api.route(method, self.path)
            try:
                body = json.loads(raw) if raw else None
            except json.JSONDecodeError as e:
                raise APIError(400, f"the request body is not valid JSON: {e}") from None
            handler(self, body)
        except APIError as e:
            self._fail(e)
        except RequestError as e:  # bad content: reserved tokens, a prompt too long, a bad schema
            code = "context_length_exceeded" if "max_model_len" in str(e) else None
            self._fail(APIError(400, str(e), code=code))
        except (BrokenPipeError, ConnectionResetError):
            log.info("client went away")
        except Exception as e:  # noqa: BLE001 - the server must survive anything a request does
            log.exception("request failed")
            self._fail(APIError(500, f"{type(e).__name__}: {e}", "server_error"))

    def do_GET(self):
        self._handle("GET")

    def do_POST(self):
        self._handle("POST")

    def log_message(self, format, *args):
        log.info("%s - %s", self.address_string(), format % args)
