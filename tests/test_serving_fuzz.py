"""One bad request must never take the OpenAI-compatible server down: every field's range,
failure isolation in the engine loop, parse errors as client errors, and a seeded fuzz run of
hostile requests after which a valid request still succeeds."""

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import make_model_dir

from agentic_jax.inference.decoding.sampling import (
    INT32_MAX,
    SEED_RANGE,
    SamplingArrays,
    SamplingParams,
)
from agentic_jax.inference.errors import EngineFailure, RequestError
from agentic_jax.inference.serving.chat_model import ChatModel, Generation
from agentic_jax.inference.serving.engine import Engine, EngineConfig, Request
from agentic_jax.inference.serving.engine_loop import EngineLoop
from agentic_jax.inference.serving.openai_server import OpenAIServer, ServerLimits

MODEL = "rl"
ENGINE = EngineConfig(num_slots=4, min_prefill_len=512)
OK = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 3,
    "temperature": 0,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["oslo", "rome"]}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz-model")
    make_model_dir(path, max_seq_len=512)
    chat = ChatModel.from_checkpoint(path, ENGINE, max_tool_call_tokens=16)
    yield chat
    chat.close()


@pytest.fixture(scope="module")
def server(model):
    with OpenAIServer(model, model_name=MODEL, limits=ServerLimits(max_request_bytes=2**16)) as s:
        yield s


def send(server, method: str, path: str, body: bytes | dict | None = None, headers=None):
    """``(status, parsed JSON body)`` of one request."""
    data = json.dumps(body).encode() if isinstance(body, dict | list) else body
    request = urllib.request.Request(
        server.url.removesuffix("/v1") + path,
        data,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, _decoded(response)
    except urllib.error.HTTPError as e:
        return e.code, _decoded(e)


def _decoded(response):
    """A JSON body parsed; a stream of server-sent events as its list of data lines."""
    data = response.read()
    if response.headers.get_content_type() == "text/event-stream":
        return [line[6:] for line in data.decode().splitlines() if line.startswith("data: ")]
    return json.loads(data or b"null")


def assert_serves(server):
    """A valid request succeeds and /health says the loop runs."""
    status, body = send(server, "POST", "/v1/chat/completions", OK)
    assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
    status, health = send(server, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and health["engine_loop"] == "running"


def assert_error_object(status, body, expected):
    assert status == expected, body
    assert set(body["error"]) == {"message", "type", "param", "code"}


# ------------------------------------------------------------------------- the reported defects
@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tokens", 9223372036854775808),
        ("seed", 18446744073709551616),
        ("max_completion_tokens", 2**31),
        ("seed", -(2**63) - 1),
    ],
)
def test_an_out_of_range_integer_is_a_400_and_the_server_goes_on(server, field, value):
    status, body = send(server, "POST", "/v1/chat/completions", {**OK, field: value})
    assert_error_object(status, body, 400)
    assert field in body["error"]["message"]
    assert_serves(server)


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"\xff\xfe\x00", "UTF-8, UTF-16 or UTF-32"),
        (b"[" * 5000 + b"]" * 5000, "nests deeper"),
        (b"[" * 65 + b"]" * 65, "nests deeper"),
        (b'{"model": NaN}', "not valid JSON"),
        (b"1" * 5000, "not valid JSON"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_a_body_that_is_not_json_is_a_400(server, raw, why):
    status, body = send(server, "POST", "/v1/chat/completions", raw)
    assert_error_object(status, body, 400)
    assert why in body["error"]["message"]
    assert_serves(server)


def test_utf16_and_utf32_bodies_are_read_as_json(server):
    for encoding in ("utf-16", "utf-32"):
        status, body = send(server, "POST", "/v1/chat/completions", json.dumps(OK).encode(encoding))
        assert status == 200 and body["object"] == "chat.completion"


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("PUT", "/v1/completions", 405),
        ("DELETE", "/v1/models", 405),
        ("PATCH", "/health", 405),
        ("BREW", "/v1/chat/completions", 405),
        ("DELETE", "/v1/nowhere", 404),
    ],
)
def test_methods_a_path_does_not_take_are_405s_with_the_error_object(server, method, path, status):
    code, body = send(server, method, path, b"{}")
    assert_error_object(code, body, status)
    if status == 405:
        assert "not allowed" in body["error"]["message"]


# ------------------------------------------------------------------------- validation at the boundary
def test_max_tokens_must_fit_beside_the_prompt(server):
    status, body = send(server, "POST", "/v1/chat/completions", {**OK, "max_tokens": 600})
    assert_error_object(status, body, 400)
    assert "max_tokens=600 does not fit" in body["error"]["message"]
    assert body["error"]["code"] == "context_length_exceeded"
    # Without an explicit max_tokens a completion still stops at max_model_len.
    status, body = send(
        server, "POST", "/v1/completions", {"model": MODEL, "prompt": "The cat", "temperature": 0}
    )
    assert status == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
    assert body["usage"]["total_tokens"] <= 512


@pytest.mark.parametrize(
    "change, param",
    [
        ({"top_k": 10**6}, "top_k"),
        ({"n": 9}, "n"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": "x" * 257}, "stop"),
        ({"messages": [{"role": "user", "content": "hi"}] * 1025}, "messages"),
        ({"tools": [WEATHER] * 129}, "tools"),
        ({"temperature": 1e300}, "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
    ],
)
def test_each_limit_is_a_400_naming_its_field(model, change, param):
    with OpenAIServer(model, model_name=MODEL) as server:
        status, body = send(server, "POST", "/v1/chat/completions", {**OK, **change})
    assert_error_object(status, body, 400)
    assert param in body["error"]["message"] or body["error"]["param"] == param


def test_a_body_over_the_size_limit_is_a_413(server):
    huge = {**OK, "messages": [{"role": "user", "content": "x" * 2**16}]}
    status, body = send(server, "POST", "/v1/chat/completions", huge)
    assert_error_object(status, body, 413)
    assert_serves(server)


def test_a_tool_schema_too_large_to_constrain_is_a_400(server):
    wide = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"s": {"type": "string", "maxLength": 10**6}},
            },
        },
    }
    status, body = send(
        server, "POST", "/v1/chat/completions", {**OK, "tools": [wide], "tool_choice": "required"}
    )
    assert_error_object(status, body, 400)
    assert "constrain" in body["error"]["message"]  # too large to constrain


def test_n_choices_are_batched_and_seeded_choices_differ(server):
    request = {**OK, "n": 3, "temperature": 1.0, "seed": 7, "max_tokens": 6}
    status, body = send(server, "POST", "/v1/chat/completions", request)
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    again = send(server, "POST", "/v1/chat/completions", request)[1]
    texts = [c["message"]["content"] for c in body["choices"]]
    assert texts == [c["message"]["content"] for c in again["choices"]]  # seeded: reproducible
    assert len(set(texts)) > 1
    status, body = send(
        server,
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": ["a", "b"], "n": 2, "max_tokens": 2, "temperature": 0},
    )
    assert status == 200 and len(body["choices"]) == 4 and body["usage"]["completion_tokens"] == 8


def test_requests_over_the_concurrency_limit_are_503s():
    release, started = threading.Event(), threading.Event()

    class Blocking:
        def complete(self, prompt, params, on_text=None, *, strict_max_tokens=False):
            started.set()
            release.wait(60)
            return Generation(prompt, (), "stop", 1, 1)

    body = {"model": MODEL, "prompt": "p"}
    with OpenAIServer(
        Blocking(), model_name=MODEL, limits=ServerLimits(max_concurrent_requests=1)
    ) as server:
        first = threading.Thread(target=send, args=(server, "POST", "/v1/completions", body))
        first.start()
        assert started.wait(60)
        status, error = send(server, "POST", "/v1/completions", body)
        release.set()
        first.join(60)
        assert_error_object(status, error, 503)
        assert send(server, "POST", "/v1/completions", body)[0] == 200


# ------------------------------------------------------------------------- SamplingParams
FIELDS = {
    "temperature": st.one_of(st.floats(allow_nan=True), st.integers(-(2**70), 2**70)),
    "top_k": st.one_of(st.integers(-(2**70), 2**70), st.floats()),
    "top_p": st.floats(allow_nan=True),
    "min_p": st.floats(allow_nan=True),
    "repetition_penalty": st.floats(allow_nan=True),
    "frequency_penalty": st.one_of(st.floats(allow_nan=True), st.integers(-(2**200), 2**200)),
    "max_tokens": st.one_of(st.integers(-(2**70), 2**70), st.floats()),
    "seed": st.one_of(st.none(), st.integers(-(2**70), 2**70), st.booleans()),
}
F32_MAX = 3.4028234663852886e38


def _expected_ok(name, value) -> bool:
    """An independent statement of each field's range."""
    if name == "seed":
        return value is None or (type(value) is int and SEED_RANGE[0] <= value <= SEED_RANGE[1])
    if name in ("top_k", "max_tokens"):
        integral = type(value) is int or (isinstance(value, float) and value.is_integer())
        return integral and (0 if name == "top_k" else 1) <= value <= INT32_MAX
    if isinstance(value, float) and (value != value or abs(value) > F32_MAX):
        return False
    if abs(value) > F32_MAX:
        return False
    return {
        "temperature": value >= 0,
        "top_p": 0 < value <= 1,
        "min_p": 0 <= value <= 1,
        "repetition_penalty": value > 0,
    }.get(name, True)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(FIELDS)).flatmap(lambda name: st.tuples(st.just(name), FIELDS[name])))
def test_sampling_params_accepts_exactly_what_the_engine_can_hold(field):
    name, value = field
    try:
        params = SamplingParams(**{name: value})
    except RequestError as e:
        assert not _expected_ok(name, value) and name in str(e)
        return
    assert _expected_ok(name, value)
    SamplingArrays.from_params([params])  # what used to overflow inside the engine loop


# ------------------------------------------------------------------------- failure isolation
def test_a_request_whose_prefill_fails_fails_alone(model, monkeypatch):
    engine = Engine(model.params, model.config, ENGINE)
    prompts = [model.encode(p) for p in ("The cat", "A dog", "Once upon")]
    prefill = engine._prefill

    def faulty(seq):
        if seq.request_id == "bad":
            raise OverflowError("injected")
        return prefill(seq)

    monkeypatch.setattr(engine, "_prefill", faulty)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with pytest.raises(OverflowError, match="injected"):
        engine.generate([Request(prompts[0], params, "good"), Request(prompts[1], params, "bad")])
    assert not engine.has_unfinished() and engine.blocks.num_free_blocks == engine.num_blocks
    [done] = engine.generate([Request(prompts[2], params)])  # the engine still serves
    assert len(done.tokens) == 4


def test_the_engine_loop_fails_one_request_and_serves_the_others(model, monkeypatch):
    loop = EngineLoop(Engine(model.params, model.config, ENGINE)).start()
    try:
        prefill = loop.engine._prefill
        monkeypatch.setattr(
            loop.engine,
            "_prefill",
            lambda seq: _raise(ValueError("injected")) if len(seq.prompt) == 2 else prefill(seq),
        )
        params = SamplingParams(temperature=0.0, max_tokens=5)
        bad = loop.submit([5, 6], params)
        good = [loop.submit(model.encode(p), params) for p in ("The cat", "A dog")]
        with pytest.raises(ValueError, match="injected"):
            list(bad)
        assert [len(list(events)) for events in good] == [5, 5]
        assert loop.health()["restarts"] == 0 and loop.health()["failed_requests"] == 1
    finally:
        loop.stop()


def _raise(error):
    raise error


def test_a_failed_decode_fails_the_batch_resets_the_engine_and_the_loop_goes_on(
    server, model, monkeypatch
):
    decode, calls = model.engine._decode, []

    def faulty(seqs):
        calls.append(len(seqs))
        if len(calls) == 2:
            raise RuntimeError("injected device fault")
        return decode(seqs)

    monkeypatch.setattr(model.engine, "_decode", faulty)
    restarts = model.loop.health()["restarts"]
    status, body = send(server, "POST", "/v1/chat/completions", {**OK, "max_tokens": 6})
    assert_error_object(status, body, 500)
    assert "injected device fault" in body["error"]["message"]
    assert body["error"]["type"] == "server_error"
    health = send(server, "GET", "/health")[1]
    assert health["restarts"] == restarts + 1 and "injected" in health["last_error"]
    assert_serves(server)
    assert not model.engine.has_unfinished()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_loop_thread_is_detected_restarted_and_reported(model):
    engine = Engine(model.params, model.config, ENGINE)
    loop = EngineLoop(engine).start()
    step = engine.step

    def dies():  # escapes the loop's own recovery, as only a BaseException can
        engine.step = step
        raise SystemExit("injected")

    engine.step = dies
    params = SamplingParams(temperature=0.0, max_tokens=3)
    try:
        with pytest.raises(EngineFailure, match="not running"):
            list(loop.submit([5, 6, 7], params))
        assert loop.health()["engine_loop"] == "stopped"
        assert len(list(loop.submit([5, 6, 7], params))) == 3  # restarted by the next caller
        health = loop.health()
        assert health["engine_loop"] == "running" and health["restarts"] == 1
        assert "thread died" in health["last_error"]
    finally:
        loop.stop()


def test_health_is_503_when_the_loop_is_not_running(model):
    holder = type("Holder", (), {})()  # /health reads only model.loop
    holder.loop = EngineLoop(Engine(model.params, model.config, ENGINE)).start()
    with OpenAIServer(holder, model_name=MODEL) as server:
        assert send(server, "GET", "/health")[0] == 200
        holder.loop.stop()
        status, body = send(server, "GET", "/health")
    assert status == 503 and body["status"] == "unavailable" and body["engine_loop"] == "stopped"


# ------------------------------------------------------------------------- fuzzing
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
HOSTILE = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
TEXT = st.one_of(
    st.text(max_size=40), st.sampled_from(["<|im_end|>", "<tool_call>", "\x00", "\ud7ff" * 3, "hi"])
)
ROLE = st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool"]), HOSTILE)
CONTENT = st.one_of(
    TEXT,
    st.none(),
    st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", 3]), "text": st.one_of(TEXT, HOSTILE)}
        ),
        max_size=2,
    ),
    HOSTILE,
)
TOOL_CALL = st.fixed_dictionaries(
    {
        "function": st.fixed_dictionaries(
            {
                "name": st.one_of(st.just("weather"), TEXT),
                "arguments": st.one_of(
                    st.just('{"city": "oslo"}'),
                    TEXT,
                    st.just("[" * 3000 + "]" * 3000),
                    st.just("1" * 5000),
                ),
            }
        )
    },
    optional={"id": TEXT, "type": st.just("function")},
)
MESSAGE = st.fixed_dictionaries(
    {"role": ROLE},
    optional={
        "content": CONTENT,
        "tool_calls": st.lists(TOOL_CALL, max_size=2),
        "tool_call_id": TEXT,
    },
)
SCHEMA = st.one_of(
    st.just(WEATHER["function"]["parameters"]),
    HOSTILE,
    st.just({"type": "object", "properties": {"x": {"type": "array", "maxItems": 10**5}}}),
    st.just({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}}),
)
TOOL = st.one_of(
    st.just(WEATHER),
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {"name": TEXT}, optional={"parameters": SCHEMA, "description": TEXT}
            ),
        }
    ),
    HOSTILE,
)
INT_EDGES = st.one_of(
    st.integers(1, 4),
    st.sampled_from([0, -1, 2**31 - 1, 2**31, 2**63, 2**64, -(2**63) - 1]),
    HOSTILE,
)
FLOAT_EDGES = st.one_of(st.floats(0, 2), st.sampled_from([-1e-300, 1e300, 2.000001, 0.0]), HOSTILE)
SAMPLING = {
    "temperature": FLOAT_EDGES,
    "top_p": FLOAT_EDGES,
    "top_k": INT_EDGES,
    "frequency_penalty": FLOAT_EDGES,
    "presence_penalty": FLOAT_EDGES,
    "seed": INT_EDGES,
    "n": INT_EDGES,
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=6), HOSTILE),
    "stream": st.one_of(st.booleans(), HOSTILE),
    "stream_options": st.one_of(st.just({"include_usage": True}), HOSTILE),
}
WORDS = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "Zs"]), min_size=1, max_size=30
)
VALID_MESSAGE = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer", "user"]), "content": WORDS}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(WORDS, st.none()),
            "tool_calls": st.lists(
                st.just(
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "oslo"}'},
                    }
                ),
                max_size=1,
            ),
        }
    ),
    st.fixed_dictionaries(
        {"role": st.just("tool"), "tool_call_id": st.just("c1"), "content": WORDS}
    ),
)
VALID = {
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.05, 1),
    "top_k": st.integers(0, 50),
    "seed": st.integers(*SEED_RANGE),
    "stop": st.lists(WORDS, max_size=2),
    "stream": st.booleans(),
    "n": st.integers(1, 2),
    "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2),
    "stream_options": st.just({"include_usage": True}),
}
HOSTILE_FIELDS = {
    "max_tokens": INT_EDGES,
    "max_completion_tokens": INT_EDGES,
    "model": st.one_of(TEXT, HOSTILE),
    "messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), HOSTILE),
    "tools": st.one_of(st.lists(TOOL, max_size=2), HOSTILE),
    "tool_choice": st.one_of(TEXT, HOSTILE),
    "prompt": st.one_of(TEXT, st.lists(TEXT, max_size=3), HOSTILE),
    **SAMPLING,
}


def requests(base: dict, optional: dict):
    """Valid requests (``base`` and some of ``optional``), each with 0-2 fields replaced by a
    hostile value, so that most requests reach the engine and the rest probe one edge at a time."""
    valid = st.fixed_dictionaries(base, optional=optional)
    fields = st.sampled_from(sorted(HOSTILE_FIELDS))
    patch = st.lists(
        fields.flatmap(lambda k: st.tuples(st.just(k), HOSTILE_FIELDS[k])), max_size=2
    ).map(dict)
    return st.builds(
        lambda body, changes: {**body, **changes}, valid, st.one_of(st.just({}), patch)
    )


CHAT = requests(
    {
        "model": st.just(MODEL),
        "messages": st.lists(VALID_MESSAGE, min_size=1, max_size=3),
        "max_tokens": st.integers(1, 4),
    },
    {
        "tools": st.just([WEATHER]),
        "tool_choice": st.sampled_from(
            ["auto", "none", "required", {"type": "function", "function": {"name": "weather"}}]
        ),
        **VALID,
    },
)
COMPLETION = requests(
    {
        "model": st.just(MODEL),
        "prompt": st.one_of(WORDS, st.lists(WORDS, min_size=1, max_size=3)),
        "max_tokens": st.integers(1, 4),
    },
    VALID,
)
RAW_BODIES = [
    b"",
    b"\xff\xfe\x00",
    b"\x00" * 64,
    b"[" * 5000,
    b"{" * 3000,
    b'{"model": 1e999}',
    b'{"a": ' * 2000 + b"1" + b"}" * 2000,
    b"null",
    b"[]",
    b'"text"',
    b"\xef\xbb\xbf{}",
    b'{"model": "rl", "messages": [{"role": "user", "content": "\\ud800"}]}',
    '{"model": "rl", "messages": [{"role": "user", "content": "é"}]}'.encode("utf-16-le"),
    b"9" * 10000,
    b'{"model": Infinity}',
]
PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/v1/models/rl",
    "/v1/../etc/passwd",
    "/v1/chat/completions?x=%ff",
]


def fuzz(server, model, strategy, examples: int, request) -> None:
    """Sends ``examples`` requests drawn from ``strategy`` (``request(drawn)`` sends one and
    returns its status and body); none may be a 5xx or a stream that ends in a server error, none
    may restart the engine loop, and a valid request succeeds afterwards."""
    restarts = model.loop.health()["restarts"]

    @settings(max_examples=examples, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(drawn):
        status, body = request(drawn)
        assert status < 500, (drawn, body)
        if isinstance(body, list):  # a stream: its events
            assert not any('"server_error"' in event for event in body), (drawn, body)

    one()
    assert model.loop.health()["restarts"] == restarts
    assert_serves(server)


def test_fuzz_chat_completions(server, model):
    fuzz(server, model, CHAT, 250, lambda body: send(server, "POST", "/v1/chat/completions", body))


def test_fuzz_completions(server, model):
    fuzz(server, model, COMPLETION, 100, lambda body: send(server, "POST", "/v1/completions", body))


def test_fuzz_raw_bodies_methods_and_paths(server, model):
    fuzz(
        server,
        model,
        st.tuples(
            st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD"]),
            st.sampled_from(PATHS),
            st.sampled_from(RAW_BODIES),
        ),
        80,
        lambda r: (_head(server, r[1]), None) if r[0] == "HEAD" else send(server, *r),
    )


def _head(server, path):
    request = urllib.request.Request(server.url.removesuffix("/v1") + path, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_stalled_client_is_dropped_after_the_read_timeout(model):
    with OpenAIServer(model, model_name=MODEL, limits=ServerLimits(read_timeout_s=0.5)) as server:
        with socket.create_connection(server.address, timeout=30) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            deadline, response = time.monotonic() + 30, b""
            while (chunk := s.recv(4096)) and time.monotonic() < deadline:  # b"": closed
                response += chunk
        assert response.startswith(b"HTTP/1.1 408")
        assert send(server, "GET", "/v1/models")[0] == 200
