"""HTTPPolicy on the openai SDK against a scripted OpenAI-compatible server: streamed text and
tool-call argument deltas assembled, retries that wait what ``Retry-After`` says, timeouts, the
API key, and the server's errors as PolicyErrors."""

import http.server
import itertools
import json
import threading
import time

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings
from openai.types.chat import ChatCompletionChunk

from agentic_jax.agents import HTTPPolicy, PolicyError, ReActAgent, Usage
from agentic_jax.agents.policies.base import StreamedPolicy, StreamingPolicy
from agentic_jax.agents.policies.http_policy import assemble_stream
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.data.chat import Message, ToolCall


class ScriptedServer:
    """An HTTP server that answers each request with the next of ``replies`` — ``(status,
    headers, body)``: a dict is sent as JSON, a list of dicts as server-sent events ending in
    ``[DONE]``, ``None`` waits for :attr:`release` and sends nothing — and records every request
    as ``(time.monotonic(), path, headers (lower-case names), JSON body)`` in :attr:`requests`."""

    def __init__(self, replies):
        self.replies, self.requests = list(replies), []
        self.release = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                headers = {k.lower(): v for k, v in self.headers.items()}
                server.requests.append((time.monotonic(), self.path, headers, body))
                status, headers, reply = server.replies.pop(0)
                if reply is None:
                    server.release.wait(60)
                    return
                if isinstance(reply, list):
                    data = "".join(f"data: {json.dumps(c)}\n\n" for c in reply)
                    data, kind = (data + "data: [DONE]\n\n").encode(), "text/event-stream"
                else:
                    data, kind = json.dumps(reply).encode(), "application/json"
                self.send_response(status)
                for k, v in {"Content-Type": kind, **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def scripted():
    servers = []

    def start(*replies):
        servers.append(ScriptedServer(replies))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def completion(message: dict, finish: str = "stop", usage=(3, 2)) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage[0], "completion_tokens": usage[1]},
    }


def chunk(delta: dict | None, finish: str | None = None, usage=None) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    body = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    return {**body, "choices": choices, **({"usage": usage} if usage else {})}


def stream_of(text_pieces, calls, finish="stop", usage=(3, 2)) -> list[dict]:
    """Chunks carrying ``text_pieces`` and then ``calls`` (``(name, argument pieces)`` each, their
    pieces interleaved across calls, as a server emitting them in parallel would)."""
    chunks = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in text_pieces]
    for i, (name, _) in enumerate(calls):
        head = {"index": i, "id": f"call_{i}", "type": "function"}
        chunks.append(
            chunk({"tool_calls": [{**head, "function": {"name": name, "arguments": ""}}]})
        )
    longest = max((len(pieces) for _, pieces in calls), default=0)
    for j in range(longest):
        for i, (_, pieces) in enumerate(calls):
            if j < len(pieces):
                delta = {"tool_calls": [{"index": i, "function": {"arguments": pieces[j]}}]}
                chunks.append(chunk(delta))
    chunks.append(chunk({}, finish))
    counts = {"prompt_tokens": usage[0], "completion_tokens": usage[1], "total_tokens": sum(usage)}
    return [*chunks, chunk(None, usage=counts)]


def cut(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


pieces_of = st.tuples(st.text(max_size=30), st.lists(st.integers(0, 30), max_size=6))


@settings(max_examples=60, deadline=None)
@given(
    text=pieces_of,
    calls=st.lists(
        st.tuples(st.sampled_from(["calculator", "weather"]), pieces_of), min_size=0, max_size=3
    ),
)
def test_streamed_text_and_tool_call_deltas_assemble_into_the_turn(text, calls):
    text_pieces = cut(*text)
    arguments = [cut(*pieces) for _, pieces in calls]
    chunks = stream_of(text_pieces, [(n, a) for (n, _), a in zip(calls, arguments)], "tool_calls")
    seen = []
    turn = assemble_stream(map(ChatCompletionChunk.model_validate, chunks), seen.append)
    assert turn.text == text[0] and [d.text for d in seen if d.call is None] == [
        p for p in text_pieces if p
    ]
    assert turn.tool_calls == tuple(ToolCall(name, whole or "{}") for name, (whole, _) in calls)
    # Each call's pieces as they came: the first names it, all of them join to its arguments.
    for i, (name, (whole, _)) in enumerate(calls):
        first, *rest = [d for d in seen if d.call == i]
        assert first.name == name and {d.name for d in rest} <= {""}
        assert "".join(d.arguments for d in [first, *rest]) == whole
    assert turn.finish_reason == "tool_calls" and turn.usage == Usage(3, 2)


def test_a_streamed_turn_through_the_sdk(scripted):
    arguments = '{"expression": "17 * 23"}'
    server = scripted(
        (
            200,
            {},
            stream_of(
                ["Let me ", "compute."], [("calculator", cut(arguments, [3, 9]))], "tool_calls"
            ),
        ),
        (200, {}, stream_of(["391"], [])),
    )
    seen = []
    policy = HTTPPolicy(server.url, "m", defaults={"temperature": 0})
    assert isinstance(policy, StreamingPolicy)
    result = ReActAgent(StreamedPolicy(policy, seen.append), [calculator]).run("What is 17 * 23?")
    assert result.ok and result.answer == "391"
    assert [d.text for d in seen if d.call is None] == ["Let me ", "compute.", "391"]
    assert [(d.name, d.arguments) for d in seen if d.call == 0] == [
        ("calculator", ""),
        ("", arguments[:3]),
        ("", arguments[3:9]),
        ("", arguments[9:]),
    ]
    assert result.messages[1].tool_calls == (ToolCall("calculator", {"expression": "17 * 23"}),)
    first = server.requests[0][3]
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert first["temperature"] == 0 and first["tools"][0]["function"]["name"] == "calculator"
    assert result.usage.prompt_tokens == 6 and result.usage.completion_tokens == 4


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_malformed_tool_call_json_from_a_server_is_an_error_the_model_sees(scripted, stream):
    cut_off = '{"expression": "17 * 2'  # a call cut off at the token limit: not JSON
    if stream:
        replies = [
            stream_of([], [("calculator", cut(cut_off, [5]))], "length"),
            stream_of(["34"], []),
        ]
    else:
        call = {
            "id": "a",
            "type": "function",
            "function": {"name": "calculator", "arguments": cut_off},
        }
        replies = [
            completion({"role": "assistant", "content": None, "tool_calls": [call]}, "length"),
            completion({"role": "assistant", "content": "34"}),
        ]
    server = scripted(*[(200, {}, r) for r in replies])
    result = ReActAgent(HTTPPolicy(server.url, "m", stream=stream), [calculator]).run(
        "What is 17 * 2?"
    )
    assert result.ok and result.answer == "34"
    [event] = [e for e in result.trace if e["kind"] == "tool_call"]
    assert event["status"] == "invalid_arguments" and event["arguments"] == cut_off
    assert result.messages[2].content.startswith("error: arguments must be a JSON object")
    # The model's own call goes back as it wrote it, answered by the error.
    call, answer = server.requests[1][3]["messages"][-2:]
    assert call["tool_calls"][0]["function"]["arguments"] == cut_off
    assert answer["tool_call_id"] == call["tool_calls"][0]["id"]


def test_a_503_is_retried_after_the_wait_its_retry_after_asks_for(scripted):
    busy = {"error": {"message": "busy", "type": "server_error", "param": None, "code": None}}
    server = scripted((503, {"Retry-After": "2"}, busy), (200, {}, stream_of(["ok"], [])))
    turn = HTTPPolicy(server.url, "m", max_retries=1).respond([Message("user", "hi")])
    assert turn.text == "ok"
    (first, *_), (second, *_) = server.requests
    # The SDK's own backoff would wait at most 0.5 s before the first retry: 2 s is the header's.
    assert 2.0 <= second - first < 30.0


def test_retries_end_in_a_policy_error_and_a_client_error_is_not_retried(scripted):
    busy = {"error": {"message": "busy", "type": "server_error", "param": None, "code": None}}
    bad = {"error": {"message": "temperature: too hot", "type": "invalid_request_error"}}
    server = scripted(
        (503, {"Retry-After": "0"}, busy), (503, {"Retry-After": "0"}, busy), (400, {}, bad)
    )
    with pytest.raises(PolicyError, match="HTTP 503"):
        HTTPPolicy(server.url, "m", max_retries=1).respond([Message("user", "hi")])
    with pytest.raises(PolicyError, match=r"HTTP 400.*too hot"):
        HTTPPolicy(server.url, "m", max_retries=3).respond([Message("user", "hi")])
    assert len(server.requests) == 3


def test_a_server_that_does_not_answer_times_out(scripted):
    server = scripted((200, {}, None), (200, {}, None))
    policy = HTTPPolicy(server.url, "m", timeout_s=0.5, max_retries=1)
    with pytest.raises(PolicyError, match="cannot reach"):
        policy.respond([Message("user", "hi")])
    assert len(server.requests) == 2  # a timeout is retried too


def test_an_error_event_in_the_stream_is_a_policy_error(scripted):
    error = {"error": {"message": "the server is shutting down", "type": "server_error"}}
    server = scripted((200, {}, [chunk({"role": "assistant", "content": "Hel"}), error]))
    with pytest.raises(PolicyError, match="shutting down"):
        HTTPPolicy(server.url, "m").respond([Message("user", "hi")])


def test_the_api_key_is_sent_and_the_environment_key_never_is(scripted, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-environment")
    server = scripted(*[(200, {}, stream_of(["ok"], []))] * 2)
    HTTPPolicy(server.url, "m", api_key="sk-given").respond([Message("user", "hi")])
    HTTPPolicy(server.url, "m").respond([Message("user", "hi")])
    keys = [headers["authorization"] for _, _, headers, _ in server.requests]
    assert keys[0] == "Bearer sk-given" and "sk-from-the-environment" not in keys[1]


@pytest.mark.parametrize("bad", [{"timeout_s": 0}, {"max_retries": -1}])
def test_bad_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        HTTPPolicy("http://127.0.0.1:1/v1", "m", **bad)
