"""The OpenAI-compatible server as an ASGI application: its OpenAPI document, bearer
authentication, the size limit enforced while the body streams in, generations stopped by a
client that leaves, and graceful shutdown."""

import http.client
import json
import socket
import threading
import time

import anyio
import httpx
import jsonschema
import pytest
import test_serving_server

from agentic_jax.inference.serving.chat_model import Generation
from agentic_jax.inference.serving.openai_server import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIServer,
    ServerLimits,
)

openai = pytest.importorskip("openai")

MODEL = "tiny"
# The server tests' tiny model (module fixtures), for the tests that need a real engine.
model_dir, model = test_serving_server.model_dir, test_serving_server.model
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Once upon a time"}]}
LONG = {**CHAT, "temperature": 0, "max_tokens": 600}  # far more steps than the tests wait for


class Echo:
    """A stand-in for ChatModel where only the HTTP layer is tested: ``complete`` echoes the
    prompt once ``release`` is set (at once by default), after setting ``started``."""

    def __init__(self):
        self.started, self.release = threading.Event(), threading.Event()
        self.release.set()

    def complete(self, prompt, params, on_text=None, *, strict_max_tokens=False):
        self.started.set()
        assert self.release.wait(60)
        return Generation(prompt, (), "stop", 1, 1)


def wait_until(condition, timeout_s: float = 60.0) -> bool:
    """Whether ``condition()`` came to hold within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def request(server, method: str, path: str, body=None, headers=None):
    """``(status, headers, raw body)`` of one request on its own connection."""
    connection = http.client.HTTPConnection(*server.address, timeout=60)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        connection.request(
            method, path, data, {"Content-Type": "application/json", **(headers or {})}
        )
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def raw_exchange(server, data: bytes) -> bytes:
    """What the server sends back on a connection that is sent ``data``, up to its closing."""
    with socket.create_connection(server.address, timeout=30) as s:
        s.sendall(data)
        response = b""
        while chunk := s.recv(65536):  # ends when the server closes the connection
            response += chunk
    return response


def assert_error_object(raw: bytes, code: str | None = None) -> dict:
    error = json.loads(raw)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert code is None or error["code"] == code
    return error


# ------------------------------------------------------------------------------- OpenAPI
def _local_refs(schema):
    """``schema`` with the document's component references written as a model schema's own."""
    text = json.dumps(schema).replace("#/components/schemas/", "#/$defs/")
    return json.loads(text)


def test_the_openapi_document_has_every_route_and_the_request_models_schemas():
    with OpenAIServer(Echo(), model_name=MODEL) as server:
        status, headers, raw = request(server, "GET", "/openapi.json")
        routes = {route.path for route in server.app.routes}
    assert status == 200 and headers.get_content_type() == "application/json"
    document = json.loads(raw)
    assert document["openapi"].startswith("3.1") and set(document["paths"]) == routes
    components = document["components"]["schemas"]
    for path, request_model in [
        ("/v1/chat/completions", ChatCompletionRequest),
        ("/v1/completions", CompletionRequest),
    ]:
        ref = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        name = ref["schema"]["$ref"].removeprefix("#/components/schemas/")
        expected = request_model.model_json_schema()
        defs = expected.pop("$defs", {})
        assert _local_refs(components[name]) == expected
        assert all(_local_refs(components[k]) == v for k, v in defs.items())
        # The document's schema, its references resolved within it, judges bodies as the
        # server does: a valid one passes, an unknown field or an out-of-range value fails.
        schema = {**components[name], "components": document["components"]}
        validator = jsonschema.Draft202012Validator(schema)
        body = CHAT if request_model is ChatCompletionRequest else {"model": MODEL, "prompt": "hi"}
        assert validator.is_valid(body)
        assert not validator.is_valid({**body, "logit_bias": {"1": 5}})
        assert not validator.is_valid({**body, "temperature": 7})
    error = document["paths"]["/v1/models"]["get"]["responses"]["default"]
    assert error["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_an_unknown_field_is_a_400_that_names_it():
    with OpenAIServer(Echo(), model_name=MODEL) as server:
        for body, param in [
            ({**CHAT, "logit_bias": {"1": 5}}, "logit_bias"),
            (
                {**CHAT, "messages": [{"role": "user", "content": "hi", "name": "x"}]},
                "messages.0.name",
            ),
            ({"model": MODEL, "prompt": "hi", "suffix": "!"}, "suffix"),
        ]:
            path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
            status, _, raw = request(server, "POST", path, body)
            assert status == 400
            error = assert_error_object(raw)
            assert error["param"] == param and error["message"].startswith(param)


def test_the_app_runs_under_another_asgi_server():
    """``OpenAIServer.app`` needs no uvicorn: httpx's in-process ASGI transport serves it too."""
    server = OpenAIServer(Echo(), model_name=MODEL)

    async def exchange():
        transport = httpx.ASGITransport(app=server.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://asgi") as client:
            models = await client.get("/v1/models")
            completion = await client.post("/v1/completions", json={"model": MODEL, "prompt": "hi"})
            return models, completion

    try:
        models, completion = anyio.run(exchange)
    finally:
        server.close()
    assert models.json()["data"][0]["id"] == MODEL
    assert completion.status_code == 200 and completion.json()["choices"][0]["text"] == "hi"


# ------------------------------------------------------------------------------- authentication
def test_every_endpoint_but_health_needs_the_api_key(model):
    with OpenAIServer(model, model_name=MODEL, api_key="s3cret") as server:
        wrong = openai.OpenAI(base_url=server.url, api_key="guess", max_retries=0, timeout=60)
        with pytest.raises(openai.AuthenticationError) as denied:
            wrong.models.list()
        assert denied.value.code == "invalid_api_key"
        for path in ("/v1/models", "/openapi.json", "/v1/nowhere"):
            status, headers, raw = request(server, "GET", path)
            assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
            assert_error_object(raw, "invalid_api_key")
        status, _, raw = request(
            server, "POST", "/v1/completions", {"model": MODEL, "prompt": "hi"}
        )
        assert status == 401
        assert request(server, "GET", "/health")[0] == 200
        key = {"Authorization": "Bearer s3cret"}
        status, _, raw = request(server, "GET", "/openapi.json", headers=key)
        assert status == 200 and json.loads(raw)["security"] == [{"bearer": []}]
        right = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0, timeout=60)
        reply = right.completions.create(model=MODEL, prompt="The cat", max_tokens=2)
        assert reply.usage.completion_tokens == 2


def test_an_empty_api_key_is_refused(model):
    with pytest.raises(ValueError, match="api_key"):
        OpenAIServer(model, api_key="")


# ------------------------------------------------------------------------------- request size
def test_an_oversized_body_is_a_413_before_it_is_read():
    limits = ServerLimits(max_request_bytes=4096)
    with OpenAIServer(Echo(), model_name=MODEL, limits=limits) as server:
        # Announced: refused with the rest of the gigabyte unsent.
        response = raw_exchange(
            server,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n"
            + b" " * 1024,
        )
        head, _, raw = response.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and b"connection: close" in head.lower()
        assert_error_object(raw, "request_too_large")
        # Chunked: refused once the chunks pass the limit, the body never finished.
        chunks = b"".join(b"400\r\n" + b" " * 1024 + b"\r\n" for _ in range(8))
        response = raw_exchange(
            server,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks,
        )
        assert response.startswith(b"HTTP/1.1 413")
        # A chunked body within the limit is read.
        body = json.dumps({"model": MODEL, "prompt": "hi"}).encode()
        response = raw_exchange(
            server,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + f"{len(body):x}\r\n".encode()
            + body
            + b"\r\n0\r\n\r\n",
        )
        assert response.startswith(b"HTTP/1.1 200") and b'"text":"hi"' in response


# ------------------------------------------------------------------------------- disconnects
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_client_that_disconnects_frees_its_engine_slot(model, stream):
    engine = model.engine
    limits = ServerLimits(max_concurrent_requests=1)
    with OpenAIServer(model, model_name=MODEL, limits=limits) as server:
        start = engine.step_count
        body = json.dumps({**LONG, "stream": stream}).encode()
        with socket.create_connection(server.address, timeout=60) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            if stream:
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")  # streaming has begun
            else:
                assert wait_until(engine.has_unfinished)  # generating
        assert wait_until(lambda: not engine.has_unfinished() and server.requests_generating == 0)
        assert engine.step_count - start < 300  # not 600: aborted
        assert model.loop.health()["requests_in_flight"] == 0
        # The server's own slot is free too: the next request is served, not a 503.
        status, _, raw = request(server, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 2})
        assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 2


# ------------------------------------------------------------------------------- shutdown
def _refuses_connections(server) -> bool:
    try:
        socket.create_connection(server.address, timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_close_lets_a_request_in_flight_finish():
    echo = Echo()
    echo.release.clear()
    server = OpenAIServer(echo, model_name=MODEL).start()
    replies = []
    client = threading.Thread(
        target=lambda: replies.append(
            request(server, "POST", "/v1/completions", {"model": MODEL, "prompt": "hi"})
        )
    )
    client.start()
    assert echo.started.wait(60)
    closer = threading.Thread(target=server.close)
    closer.start()
    assert wait_until(lambda: _refuses_connections(server))  # no new connections
    assert closer.is_alive()  # ... while the request in flight goes on
    echo.release.set()
    client.join(60)
    closer.join(60)
    assert not closer.is_alive()
    [(status, _, raw)] = replies
    assert status == 200 and json.loads(raw)["choices"][0]["text"] == "hi"


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_close_stops_what_still_generates_after_the_grace(model, stream):
    engine = model.engine
    server = OpenAIServer(model, model_name=MODEL, shutdown_grace_s=0.0).start()
    connection = http.client.HTTPConnection(*server.address, timeout=60)
    connection.request("POST", "/v1/chat/completions", json.dumps({**LONG, "stream": stream}))
    if stream:
        response = connection.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")
    else:
        assert wait_until(engine.has_unfinished)
    closer = threading.Thread(target=server.close)
    closer.start()
    closer.join(60)
    assert not closer.is_alive()  # never a hang
    if stream:
        events = [line[6:] for line in response.read().splitlines() if line.startswith(b"data: ")]
        assert events[-1] == b"[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "server_shutting_down"
    else:
        response = connection.getresponse()
        assert response.status == 503 and response.headers["Retry-After"] == "1"
        assert_error_object(response.read(), "server_shutting_down")
    connection.close()
    assert wait_until(lambda: not engine.has_unfinished())
