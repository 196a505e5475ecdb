"""The model-backed pieces on a tiny random model: constrained tool calls (JaxPolicy), continuous
batching across callers, and the OpenAI-compatible server driven by the official ``openai``
client and by HTTPPolicy."""

import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Literal

import gin
import jsonschema
import pytest
from tiny_models import make_model_dir

from agentic_jax.agents import Budget, HTTPPolicy, PolicyError, ReActAgent, StopReason, tool
from agentic_jax.agents.policies.jax_policy import JaxPolicy
from agentic_jax.cli import main
from agentic_jax.data.chat import Message
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.errors import RequestError
from agentic_jax.inference.serving.chat_model import ChatModel, Generation, TextStream
from agentic_jax.inference.serving.engine import Engine, EngineConfig
from agentic_jax.inference.serving.engine_loop import EngineLoop
from agentic_jax.inference.serving.openai_server import PROMPT_THREADS, OpenAIServer

openai = pytest.importorskip("openai")

MODEL = "tiny"
# One prefill bucket for every prompt up to 256 tokens: fewer compilations, a faster test.
ENGINE = EngineConfig(num_slots=4, min_prefill_len=256)


@tool
def weather(city: Literal["oslo", "paris", "rome"], unit: Literal["C", "F"] = "C") -> str:
    """Current temperature in a city."""
    return f"{city}: 21 {unit}"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent-model")
    make_model_dir(path, max_seq_len=1024)
    return path


@pytest.fixture(scope="module")
def model(model_dir):
    chat = ChatModel.from_checkpoint(model_dir, ENGINE, max_tool_call_tokens=80)
    yield chat
    chat.close()


@pytest.fixture(scope="module")
def server(model):
    with OpenAIServer(model, host="127.0.0.1", port=0, model_name=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather?"}]


@pytest.fixture(autouse=True)
def clean_gin():
    """CLI runs bind gin parameters; later tests in this process must not see them."""
    yield
    gin.clear_config()


def test_jax_policy_tool_calls_always_parse_and_fit_the_schema(model):
    policy = JaxPolicy(model=model)
    for seed in range(3):
        reply = policy.respond(
            [Message("user", "Weather in Oslo?")],
            [weather],
            tool_choice="required",
            temperature=1.0,
            seed=seed,
        )
        [call] = reply.tool_calls
        assert call.name == "weather" and reply.finish_reason == "tool_calls"
        jsonschema.validate(dict(call.arguments), weather.parameters)
        assert reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 2
    free = policy.respond([Message("user", "Hi")], [weather], max_tokens=4)
    assert free.finish_reason in ("stop", "length", "tool_calls") and free.usage.prompt_tokens > 0
    # No tools left to require (all cut off, say): a plain turn, as HTTPPolicy asks for one.
    reply = policy.respond([Message("user", "Hi")], tool_choice="required", max_tokens=2)
    assert reply.finish_reason in ("stop", "length") and not reply.tool_calls
    with pytest.raises(PolicyError, match="max_model_len"):
        policy.respond([Message("user", "word " * 1200)])


def test_the_engine_loop_batches_concurrent_callers(model):
    prompts = [model.encode(p) for p in ("The cat", "A dog", "Once upon")]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    loop = EngineLoop(Engine(model.params, model.config, ENGINE))
    streams = [loop.submit(p, params) for p in prompts]  # queued before the loop starts
    loop.start()
    outputs = [[e.token for e in s] for s in streams]
    loop.stop()
    assert loop.peak_batch == 3  # all three were in one step
    alone = [[e.token for e in model.loop.submit(p, params)] for p in prompts]  # one at a time
    assert outputs == alone  # batching does not change the tokens


def test_a_caller_that_stops_reading_aborts_its_request(model):
    """A callback that raises (a client gone, an MCP call timed out) ends the request in the
    engine too: its slot and blocks are free at once, not after max_tokens more steps."""

    class Gone(Exception):
        pass

    def gone(piece):
        raise Gone(piece)

    engine = model.engine

    def steps_until_idle(start):
        deadline = time.monotonic() + 30
        while (
            not model.loop._inbox.empty() or engine.has_unfinished()
        ) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not engine.has_unfinished()
        return engine.step_count - start

    start = engine.step_count
    with pytest.raises(Gone):
        model.complete("Once upon a time", SamplingParams(temperature=0.0, max_tokens=200), gone)
    assert steps_until_idle(start) < 20
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks
    # An iterator closed before its first event aborts its request as well.
    start = engine.step_count
    events = model.loop.submit(model.encode("A dog"), SamplingParams(max_tokens=200))
    events.close()
    events.close()  # twice is harmless
    assert steps_until_idle(start) < 20 and list(events) == []


def test_text_stream_holds_back_possible_stop_strings(model):
    tok = model.tokenizer
    stream = TextStream(tok, ["STOP"])
    pieces = [stream.push(t) for t in tok.encode("abc ST")]
    assert "".join(pieces) == "abc " and stream.text == "abc "
    pieces += [stream.push(t) for t in tok.encode("OP more")]
    assert stream.stopped and "".join(pieces) == "abc "


def test_models_and_api_errors(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-9", messages=MESSAGES)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=7)
    with pytest.raises(openai.BadRequestError, match="reserved token"):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "<|im_end|> hi"}]
        )
    with pytest.raises(openai.BadRequestError) as long_prompt:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "word " * 1200}], stream=True
        )
    assert long_prompt.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError, match="not among the tools"):
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            tools=[weather.spec.openai()],
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    for tools, choice in [
        ([weather.spec.openai()], {"type": "function", "function": "weather"}),
        (None, "required"),
    ]:  # malformed; nothing to call
        with pytest.raises(openai.BadRequestError, match="tool_choice"):
            client.chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=tools, tool_choice=choice
            )
    for path, body, status in [
        ("/chat/completions", b"{not json", 400),
        ("/chat/completions", b'{"model": "tiny"}', 400),
        ("/nowhere", b"{}", 404),
        ("/models", b"{}", 405),
    ]:
        request = urllib.request.Request(server.url + path, body, method="POST")
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(request, timeout=30)
        assert error.value.code == status
        assert set(json.loads(error.value.read())["error"]) == {"message", "type", "param", "code"}


class _Completer:
    """A stand-in for ChatModel where only the HTTP layer is tested: ``complete`` echoes the
    prompt, or raises what ``errors`` maps it to."""

    def __init__(self, errors=None, delay_s=0.0):
        self.errors, self.delay_s = errors or {}, delay_s
        self.running = self.peak = 0
        self.lock = threading.Lock()

    def complete(self, prompt, params, on_text=None, *, strict_max_tokens=False):
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(self.delay_s)
        with self.lock:
            self.running -= 1
        if prompt in self.errors:
            raise self.errors[prompt]
        return Generation(prompt, (), "stop", 1, 1)


def _post(server, body: dict):
    request = urllib.request.Request(
        server.url + "/completions", json.dumps(body).encode(), method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_a_long_prompt_list_runs_on_a_bounded_pool():
    model = _Completer(delay_s=0.02)
    prompts = [f"p{i}" for i in range(3 * PROMPT_THREADS)]
    with OpenAIServer(model, model_name=MODEL) as server:
        status, body = _post(server, {"model": MODEL, "prompt": prompts})
    assert status == 200 and [c["text"] for c in body["choices"]] == prompts
    assert 1 < model.peak <= PROMPT_THREADS


def test_request_errors_are_400s_and_internal_errors_500s():
    model = _Completer({"bad": RequestError("too long"), "bug": ValueError("an internal bug")})
    with OpenAIServer(model, model_name=MODEL) as server:
        assert _post(server, {"model": MODEL, "prompt": "bad"})[0] == 400
        status, body = _post(server, {"model": MODEL, "prompt": "bug"})
        assert status == 500 and body["error"]["type"] == "server_error"
        assert _post(server, {"model": MODEL, "prompt": "ok", "stop": [""]})[0] == 400


@pytest.mark.parametrize("header", ["Content-Length: -1", "Content-Length: ten"])
def test_a_body_of_unknown_length_is_an_error_that_closes_the_connection(header):
    with (
        OpenAIServer(_Completer(), model_name=MODEL) as server,
        socket.create_connection(server.address, timeout=10) as s,
    ):
        s.sendall(
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\n{header}\r\n\r\n"
            "2\r\n{}\r\n0\r\n\r\n".encode()
        )
        response = b""
        while chunk := s.recv(4096):  # ends when the server closes the connection
            response += chunk
    assert response.startswith(b"HTTP/1.1 400") and b"connection: close" in response.lower()


def test_chat_with_tools_then_a_tool_result(client):
    tools = [weather.spec.openai()]
    first = client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_tokens=8,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and first.usage.total_tokens > 0
    [call] = choice.message.tool_calls
    assert call.function.name == "weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), weather.parameters)
    followup = MESSAGES + [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "oslo: 21 C"},
    ]
    second = client.chat.completions.create(
        model=MODEL, messages=followup, tools=tools, tool_choice="none", temperature=0, max_tokens=5
    )
    assert second.choices[0].message.tool_calls is None
    assert second.choices[0].finish_reason in ("stop", "length")


def test_streaming_matches_the_non_streamed_reply(client):
    kwargs = dict(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=8)
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, stream_options={"include_usage": True}
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    tool_chunks = list(
        client.chat.completions.create(
            **kwargs, stream=True, tools=[weather.spec.openai()], tool_choice="required"
        )
    )
    # The API's deltas: the call's id and name, then its arguments in pieces.
    [opening], *arguments = [
        c.choices[0].delta.tool_calls for c in tool_chunks if c.choices[0].delta.tool_calls
    ]
    assert opening.function.name == "weather" and opening.id.startswith("call_")
    joined = "".join(piece.function.arguments for [piece] in arguments)
    jsonschema.validate(json.loads(joined), weather.parameters)
    assert {piece.index for [piece] in arguments} == {0}
    assert tool_chunks[-1].choices[0].finish_reason == "tool_calls"


def test_completions_batch_and_stream(client):
    batch = client.completions.create(
        model=MODEL, prompt=["The cat", "A dog"], max_tokens=5, temperature=0
    )
    assert [c.index for c in batch.choices] == [0, 1] and batch.usage.completion_tokens == 10
    streamed = "".join(
        c.choices[0].text
        for c in client.completions.create(
            model=MODEL, prompt="The cat", max_tokens=5, temperature=0, stream=True
        )
    )
    assert streamed == batch.choices[0].text


def test_http_policy_drives_an_agent_loop_through_the_server(server):
    policy = HTTPPolicy(server.url, MODEL, defaults={"temperature": 0, "max_tokens": 8})
    agent = ReActAgent(
        policy,
        [weather],
        budget=Budget(max_steps=3),
        system_prompt="Be brief.",
        sampling={"tool_choice": "required"},
    )
    result = agent.run("What is the weather in Rome?")
    assert result.stop_reason in (StopReason.MAX_STEPS, StopReason.REPEATED_CALL)
    observations = [m.content for m in result.messages if m.role == "tool"]
    assert observations and all(
        o.endswith((" C", " F")) or o.startswith("error: repeated") for o in observations
    )
    assert result.usage.prompt_tokens > 0 and result.tool_calls[0] == "weather"
    # Streamed and whole, a greedy turn is the same turn, tool calls and usage too; the pieces
    # streamed join to it.
    ask = ([Message("user", "Weather in Oslo?")], [weather])
    for tool_choice in ("required", "none"):
        policy = HTTPPolicy(server.url, MODEL, defaults={"max_tokens": 8, "temperature": 0})
        pieces = []
        streamed = policy.respond_streaming(*ask, pieces.append, tool_choice=tool_choice)
        whole = HTTPPolicy(server.url, MODEL, stream=False, defaults=policy.defaults).respond(
            *ask, tool_choice=tool_choice
        )
        assert streamed == whole and streamed.usage.completion_tokens > 0
        assert "".join(d.text for d in pieces) == streamed.text
        assert [
            "".join(d.arguments for d in pieces if d.call == i)
            for i in range(len(whole.tool_calls))
        ] == [c.arguments_text() for c in whole.tool_calls]
    with pytest.raises(PolicyError, match="HTTP 404"):
        HTTPPolicy(server.url, "other").respond([Message("user", "hi")])


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_the_serve_verb_serves_until_interrupted(model_dir, stop):
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentic_jax.cli",
            "serve",
            "--checkpoint",
            str(model_dir),
            "--port",
            str(port),
            "--api_key",
            "k3y",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}/v1/models"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    raise AssertionError(f"served without the API key: {r.status}")
            except urllib.error.HTTPError as e:
                assert e.code == 401
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
                time.sleep(0.2)
        keyed = urllib.request.Request(url, headers={"Authorization": "Bearer k3y"})
        with urllib.request.urlopen(keyed, timeout=5) as r:
            models = json.loads(r.read())
        assert models["data"][0]["id"] == model_dir.name
        proc.send_signal(stop)
        assert (
            proc.wait(timeout=90) == 130
        )  # generous: a loaded CI machine shuts the engine down slowly
        assert f"serving '{model_dir.name}' at http://127.0.0.1:{port}/v1" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_agent_verb_runs_a_checkpoint_with_the_calculator(model_dir, model, capsys):
    # The fixture's engine shapes, so that the compiled functions are reused.
    code = main(
        [
            "agent",
            "--gin_file",
            "agent_calculator",
            "--checkpoint",
            str(model_dir),
            "--task",
            "What is 2 + 2?",
            "--gin_param",
            "agents.AgentConfig.system_prompt='Be brief.'",
            "--gin_param",
            "agents.AgentConfig.sampling={'temperature': 0.0, 'max_tokens': 4}",
            "--gin_param",
            "EngineConfig.num_slots=4",
            "--gin_param",
            "EngineConfig.min_prefill_len=256",
        ]
    )
    out = capsys.readouterr().out
    assert "task: What is 2 + 2?" in out and "[1] model" in out
    assert ("stop: answer" in out) == (code == 0) and "stop: " in out
