"""MCP: the SDK's own client against our server, our client against our server and a third-party
server started as real subprocesses (stdio and Streamable HTTP), MCP tools inside an agent loop,
reconnection after the server is killed, name-spacing, progress, cancellation and timeouts."""

import dataclasses
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import anyio
import gin
import mcp.types as mcp_types
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.server import MCPServer, Server
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from tiny_models import make_model_dir

from agentic_jax import config as gin_config
from agentic_jax.agents import (
    Budget,
    ReActAgent,
    ScriptedPolicy,
    StopReason,
    ToolExecutor,
    tool,
)
from agentic_jax.agents.protocols import mcp_client
from agentic_jax.agents.protocols.mcp_client import (
    MCPClient,
    MCPConnectionError,
    MCPSession,
    as_target,
)
from agentic_jax.agents.protocols.mcp_server import (
    RUN_URI,
    AgentMCPServer,
    CallEnded,
    build_server,
    generation_tool,
    report_progress,
)
from agentic_jax.agents.protocols.skills import Skill, SkillRegistry
from agentic_jax.agents.session import AgentConfig, run_session
from agentic_jax.agents.tools.executor import RetryPolicy
from agentic_jax.data.chat import ToolCall
from agentic_jax.inference.decoding.sampling import SamplingParams
from agentic_jax.inference.serving.engine import EngineConfig

OUR_SERVER = [sys.executable, "-m", "agentic_jax.cli", "mcp-server"]
SKILL = Skill(
    "arithmetic",
    "Exact integer arithmetic.",
    "Use the calculator for every product.",
    tools=("calculator",),
    examples=("What is 17 * 23?",),
)
METRICS = [
    {"step": 1, "loss": 5.0, "lr": 0.1},
    {"step": 2, "loss": 4.0, "lr": 0.2},
    {"step": 2, "eval_loss": 4.5},
    {"step": 3, "loss": 4.25, "lr": 0.3},
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("run")
    make_model_dir(path, max_seq_len=64)
    (path / "config.gin").write_text("train.steps = 3\n")
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in METRICS))
    corpus = path / "corpus"
    corpus.mkdir()
    (corpus / "jax.md").write_text("JAX transforms numerical functions: jit, grad and vmap.")
    (corpus / "tea.txt").write_text("Green tea is steeped at eighty degrees.")
    return path


@pytest.fixture(scope="module")
def server(run_dir):
    s = build_server(checkpoint=run_dir, corpus=run_dir / "corpus", skills=SkillRegistry([SKILL]))
    yield s
    s.close()


@pytest.fixture(scope="module")
def local(server):
    with MCPSession(server, name="local") as session:
        yield session


def events_server() -> tuple[MCPServer, dict]:
    """A server with a tool that reports progress and one that sleeps, recording cancellation."""
    server, seen = MCPServer("events"), {"cancelled": threading.Event(), "calls": 0}

    @server.tool()
    async def count(n: int, ctx: Context) -> str:
        """Counts to n, reporting each step."""
        seen["calls"] += 1
        for i in range(n):
            await ctx.report_progress(i + 1, n, f"step {i + 1}")
        return f"counted to {n}"

    @server.tool()
    async def sleep(seconds: float) -> str:
        """Sleeps."""
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            seen["cancelled"].set()
            raise
        return "awake"

    return server, seen


def test_the_sdk_client_sees_our_tools_resources_and_prompts(server, run_dir):
    async def session():
        async with Client(server) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert set(tools) == {"calculator", "python", "search", "generate"}
            assert tools["calculator"].input_schema == server.agent_tools["calculator"].parameters
            assert tools["calculator"].input_schema["required"] == ["expression"]

            ok = await client.call_tool("calculator", {"expression": "17 * 23 + 100"})
            assert not ok.is_error and ok.content[0].text == "491"
            ran = await client.call_tool("python", {"code": "print(sum(range(10)))"})
            assert not ran.is_error and ran.content[0].text == "45"
            found = await client.call_tool("search", {"query": "numerical functions jit", "k": 1})
            assert found.content[0].text.startswith("[jax.md]")

            bad = await client.call_tool("calculator", {"expr": "1 + 1"})
            assert bad.is_error
            assert "expression: Field required" in bad.content[0].text
            assert "expr: Extra inputs are not permitted" in bad.content[0].text
            wrong_type = await client.call_tool("search", {"query": "tea", "k": 0})
            assert wrong_type.is_error and "k:" in wrong_type.content[0].text
            with pytest.raises(MCPError, match="unknown tool 'nope'; available: calculator"):
                await client.call_tool("nope", {})

            uris = {str(r.uri) for r in (await client.list_resources()).resources}
            assert uris == {
                RUN_URI + n for n in ("config.gin", "model_config.json", "metrics_summary.json")
            }
            config = await client.read_resource(RUN_URI + "config.gin")
            assert config.contents[0].text == (run_dir / "config.gin").read_text()
            model = await client.read_resource(RUN_URI + "model_config.json")
            assert json.loads(model.contents[0].text)["d_model"] == 16

            prompts = (await client.list_prompts()).prompts
            assert [(p.name, p.description) for p in prompts] == [("arithmetic", SKILL.description)]
            assert [(a.name, a.required) for a in prompts[0].arguments] == [("task", False)]
            got = await client.get_prompt("arithmetic", {"task": "What is 6 * 7?"})
            text = got.messages[0].content.text
            assert got.messages[0].role == "user" and text.startswith(SKILL.prompt())
            assert text.endswith("What is 6 * 7?")

    anyio.run(session)


def test_metrics_summary_resource(local):
    summary = json.loads(local.read_text(RUN_URI + "metrics_summary.json"))
    assert summary == {
        "records": 4,
        "last_step": 3,
        "last": {"loss": 4.25, "lr": 0.3, "eval_loss": 4.5},
        "lowest": {"loss": 4.0, "eval_loss": 4.5},
    }


@given(st.integers(-999, 999), st.integers(-999, 999), st.integers(1, 99))
def test_calculator_over_mcp_matches_python(local, a, b, c):
    result = local.call_tool("calculator", {"expression": f"({a} + {b}) * {c} - {b} / {c}"})
    assert not result.is_error
    assert result.content[0].text == str((a + b) * c - b // c)


def test_a_tool_that_exits_is_an_error_result_not_the_end_of_the_server():
    @tool
    def exits(x: int) -> int:
        """Exits, as argparse does on bad input."""
        raise SystemExit(2)

    with MCPSession(AgentMCPServer(agent_tools=[exits]), name="exits") as session:
        result = session.call_tool("exits", {"x": 1})
        assert result.is_error and result.content[0].text == "exits failed: SystemExit: 2"
        assert session.call_tool("exits", {"x": 2}).is_error and session.connects == 1


def test_a_timed_out_call_sends_no_progress_and_its_tool_stops_at_its_next_report():
    stopped = threading.Event()

    @tool(timeout_s=0.1)
    def slow() -> str:
        """Reports progress after its call has timed out."""
        time.sleep(0.3)
        try:
            report_progress(1, 1, "late")
        except CallEnded:
            stopped.set()
            raise
        return "done"

    progress = []
    with MCPSession(AgentMCPServer(agent_tools=[slow]), name="slow") as session:
        result = session.call_tool("slow", {}, progress=lambda *p: progress.append(p))
        assert result.is_error and result.content[0].text == "slow timed out after 0.1s"
        assert stopped.wait(10)
    assert progress == []


def test_generate_streams_its_text_as_progress(run_dir):
    from agentic_jax.inference.serving.chat_model import ChatModel

    model = ChatModel.from_checkpoint(run_dir, EngineConfig(num_slots=1))
    try:
        server = AgentMCPServer(agent_tools=[generation_tool(model)])
        progress = []
        with MCPSession(server) as session:
            result = session.call_tool(
                "generate",
                {"prompt": "The cat", "max_tokens": 8},
                progress=lambda *p: progress.append(p),
            )
            bad = session.call_tool("generate", {"prompt": "The cat", "max_tokens": 0})
        want = model.complete("The cat", SamplingParams(temperature=0.0, max_tokens=8)).text
    finally:
        model.close()
    assert not result.is_error and result.content[0].text == want and want.strip()
    assert "".join(message for _, _, message in progress) == want
    assert [p for p, _, _ in progress] == sorted(p for p, _, _ in progress)
    assert progress[-1][0] == len(want)
    assert (
        bad.is_error
        and "max_tokens: Input should be greater than or equal to 1" in bad.content[0].text
    )


def test_mcp_tools_validate_against_the_servers_schema_before_calling():
    server, seen = events_server()
    with MCPSession(server, name="events") as session:
        tools = {t.name: t for t in session.tools()}
        assert tools["count"].parameters == session.list_tools()[0].input_schema
        executor = ToolExecutor(tools.values())
        wrong = executor.execute(ToolCall("count", {"n": "three"}))
        missing = executor.execute(ToolCall("count", {}))
        assert seen["calls"] == 0  # rejected here, never sent
        assert wrong.status == missing.status == "invalid_arguments"
        assert "n: 'three' is not of type 'integer'" in wrong.content
        assert "'n' is a required property" in missing.content
        done = executor.execute(ToolCall("count", {"n": 2}))
        assert (done.status, done.content, seen["calls"]) == ("ok", "counted to 2", 1)


def test_mcp_tool_parameters_may_share_names_with_the_clients_own():
    server = MCPServer("tasks")

    @server.tool()
    def update(progress: int, remote_name: str, self: str) -> str:
        """Records a task's progress."""
        return f"{remote_name}/{self} at {progress}%"

    with MCPSession(server, name="tasks") as session:
        (update_tool,) = session.tools()
        arguments = {"progress": 50, "remote_name": "build", "self": "me"}
        done = ToolExecutor([update_tool]).execute(ToolCall("update", arguments))
        assert (done.status, done.content) == ("ok", "build/me at 50%")
        assert update_tool(**arguments) == "build/me at 50%"


def test_invalid_schemas_are_left_out_and_destructive_tools_need_approval(caplog):
    async def list_tools(ctx, params):
        return mcp_types.ListToolsResult(
            tools=[
                mcp_types.Tool(
                    name="broken",
                    input_schema={"type": "object", "properties": {"x": {"type": 12}}},
                ),
                mcp_types.Tool(
                    name="erase",
                    input_schema={"type": "object"},
                    annotations=mcp_types.ToolAnnotations(destructive_hint=True),
                ),
                mcp_types.Tool(
                    name="look",
                    input_schema={"type": "object"},
                    annotations=mcp_types.ToolAnnotations(
                        destructive_hint=True, read_only_hint=True
                    ),
                ),
            ]
        )

    with MCPSession(Server("odd", on_list_tools=list_tools), name="odd") as session:
        tools = session.tools()
    assert [(t.name, t.dangerous) for t in tools] == [("erase", True), ("look", False)]
    assert "tool 'broken' has an invalid input schema" in caplog.text
    denied = ToolExecutor(tools).execute(ToolCall("erase", {}))
    assert denied.status == "denied" and "not approved" in denied.content


def test_react_agent_calls_mcp_tools(server):
    policy = ScriptedPolicy(
        [
            {
                "text": "Compute it.",
                "tool_calls": [
                    {"name": "local__calculator", "arguments": {"expression": "12 * 34"}}
                ],
            },
            {
                "text": "Check a wrong call.",
                "tool_calls": [{"name": "local__calculator", "arguments": {"expression": 7}}],
            },
            "12 * 34 = 408.",
        ]
    )
    with MCPClient({"local": server}) as mcp:
        result = ReActAgent(policy, mcp.tools(), budget=Budget(max_steps=5)).run("12 * 34?")
    assert result.stop_reason == StopReason.ANSWER and result.answer == "12 * 34 = 408."
    tool_turns = [m.content for m in result.messages if m.role == "tool"]
    assert tool_turns[0] == "408"
    assert tool_turns[1].startswith(
        "error: invalid arguments for local__calculator: expression: 7 is not of type 'string'"
    )
    advertised = policy.calls[0][1]
    assert advertised == ["local__calculator", "local__python", "local__search", "local__generate"]


def test_progress_cancellation_and_timeouts():
    server, seen = events_server()
    with MCPSession(server, name="events") as session:
        progress = []
        result = session.call_tool("count", {"n": 3}, progress=lambda *p: progress.append(p))
        assert result.content[0].text == "counted to 3"
        assert progress == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]

        future = session.start_call("sleep", {"seconds": 60})
        time.sleep(0.2)
        future.cancel()
        assert seen["cancelled"].wait(10), "the server's handler was not cancelled"
        seen["cancelled"].clear()

        start = time.monotonic()
        with pytest.raises(TimeoutError, match="events"):
            session.call_tool("sleep", {"seconds": 60}, timeout_s=0.3)
        assert time.monotonic() - start < 10
        assert seen["cancelled"].wait(10)
        # The connection survives both.
        assert session.call_tool("sleep", {"seconds": 0.01}).content[0].text == "awake"
        assert session.connects == 1


def test_two_servers_are_name_spaced(server):
    other, _ = events_server()
    with MCPClient({"local": server, "events": other}) as mcp:
        names = [t.name for t in mcp.tools()]
        assert names == [
            "local__calculator",
            "local__python",
            "local__search",
            "local__generate",
            "events__count",
            "events__sleep",
        ]
        tools = {t.name: t for t in mcp.tools()}
        assert (tools["events__count"].server, tools["events__count"].remote_name) == (
            "events",
            "count",
        )
        assert tools["events__count"].fn(n=2) == "counted to 2"
        assert mcp.call_tool("local__calculator", {"expression": "2 * 21"}).content[0].text == "42"
        with pytest.raises(KeyError, match="no MCP server named 'nope'"):
            mcp.call_tool("nope__calculator", {})
        with pytest.raises(KeyError, match="not of the form"):
            mcp.call_tool("calculator", {})
    for name in ("a__b", "_a", "a b", ""):
        with pytest.raises(ValueError, match="MCP server name"):
            MCPClient({name: server})


def test_targets_and_connection_failures():
    assert as_target("http://127.0.0.1:1/mcp") == "http://127.0.0.1:1/mcp"
    params = as_target("mcp-server-time --local-timezone 'Europe/Paris'")
    assert (params.command, params.args) == (
        "mcp-server-time",
        ["--local-timezone", "Europe/Paris"],
    )
    with pytest.raises(ValueError, match="non-empty list of strings"):
        as_target([])
    with pytest.raises(TypeError, match="cannot connect to 42"):
        as_target(42)
    delays = []
    ghost = MCPSession(
        ["/nonexistent/mcp-server"],
        name="ghost",
        sleep=delays.append,
        reconnect=RetryPolicy(max_attempts=3, base_delay_s=0.5, max_delay_s=1.0),
    )
    with ghost, pytest.raises(MCPConnectionError, match="'ghost' in 3 attempts"):
        ghost.list_tools()
    assert len(delays) == 2 and 0 <= delays[0] <= 0.5 and 0 <= delays[1] <= 1.0
    with pytest.raises(MCPConnectionError, match="closed"):
        ghost.list_tools()


def test_our_server_over_stdio():
    with MCPClient({"local": OUR_SERVER}) as mcp:
        tools = mcp.tools()
        assert [t.name for t in tools] == ["local__calculator", "local__python"]  # no checkpoint
        prompts = mcp.session("local").list_prompts()
        assert {p.name for p in prompts} == {s.name for s in SkillRegistry.load()}
        done = ToolExecutor(tools).execute(ToolCall("local__python", {"code": "print(6 * 7)"}))
        assert (done.status, done.content) == ("ok", "42")


ECHO_SERVER = """
import os
import mcp.types as mcp_types
from mcp.server import MCPServer, Server

server = MCPServer("echo")


@server.tool()
def pid() -> str:
    \"\"\"The server's process id.\"\"\"
    return str(os.getpid())


server.run()
"""


def test_reconnection_after_the_server_is_killed(tmp_path):
    (tmp_path / "echo.py").write_text(ECHO_SERVER)
    with MCPClient({"echo": [sys.executable, str(tmp_path / "echo.py")]}) as mcp:
        executor = ToolExecutor(mcp.tools(), retry=RetryPolicy(max_attempts=3, base_delay_s=0.01))
        first = executor.execute(ToolCall("echo__pid", {}))
        assert (first.status, first.attempts) == ("ok", 1)

        os.kill(int(first.content), signal.SIGKILL)
        again = executor.execute(ToolCall("echo__pid", {}))
        assert again.status == "ok" and again.content != first.content
        assert again.attempts == 2  # the dropped connection, then a fresh one
        assert mcp.session("echo").connects == 2
        # Listing needs no retry by the caller: the session reconnects and asks again.
        os.kill(int(again.content), signal.SIGKILL)
        assert [t.name for t in mcp.session("echo").list_tools()] == ["pid"]
        assert mcp.session("echo").connects == 3
        last = int(mcp.call_tool("echo__pid").content[0].text)
    # Closing ends the server process and the event-loop thread.
    with pytest.raises(ProcessLookupError):
        os.kill(last, 0)
    assert "mcp-client" not in [t.name for t in threading.enumerate()]


def test_a_third_party_server_over_stdio():
    pytest.importorskip("mcp_server_time")
    command = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
    with MCPClient({"time": command}) as mcp:
        tools = {t.name: t for t in mcp.tools()}
        assert set(tools) == {"time__get_current_time", "time__convert_time"}
        executor = ToolExecutor(tools.values())
        call = ToolCall(
            "time__convert_time",
            {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        )
        converted = executor.execute(call)
        assert converted.status == "ok"
        assert json.loads(converted.content)["target"]["datetime"][11:16] == "21:00"
        bad_zone = executor.execute(ToolCall("time__get_current_time", {"timezone": "Mars/Base"}))
        assert bad_zone.status == "failed" and "Invalid timezone" in bad_zone.content
        missing = executor.execute(ToolCall("time__convert_time", {"time": "12:00"}))
        assert missing.status == "invalid_arguments"
        assert "'source_timezone' is a required property" in missing.content


def http_server(port: int) -> subprocess.Popen:
    return subprocess.Popen(
        [*OUR_SERVER, "--transport", "streamable-http", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for_port(port: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Reconnection with backoff also covers the server's start-up.
WAIT_FOR_START = RetryPolicy(max_attempts=60, base_delay_s=0.1, max_delay_s=0.5)


def test_our_server_over_streamable_http():
    port = free_port()
    process = http_server(port)
    try:
        with MCPSession(
            f"http://127.0.0.1:{port}/mcp", name="http", reconnect=WAIT_FOR_START
        ) as http:
            assert [t.name for t in http.list_tools()] == ["calculator", "python"]
            assert http.call_tool("calculator", {"expression": "99 * 99"}).content[0].text == "9801"
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_a_lost_http_session_is_replaced_by_a_new_one(monkeypatch):
    # A 2025-era (session) connection; the server forgets its sessions when it restarts, and
    # answers the old session's id with 404, after which a client must start a new session.
    monkeypatch.setattr(mcp_client, "Client", functools.partial(Client, mode="legacy"))
    port = free_port()
    process = http_server(port)
    try:
        with MCPClient({"http": f"http://127.0.0.1:{port}/mcp"}) as mcp:
            mcp.session("http").reconnect = WAIT_FOR_START
            executor = ToolExecutor(
                mcp.tools(), retry=RetryPolicy(max_attempts=2, base_delay_s=0.01)
            )
            process.terminate()
            process.wait(timeout=30)
            process = http_server(port)
            wait_for_port(port)  # up, knowing no sessions
            done = executor.execute(ToolCall("http__calculator", {"expression": "6 * 7"}))
            assert (done.status, done.content, done.attempts) == ("ok", "42", 2)
            assert mcp.session("http").connects == 2
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_the_shipped_config_runs_an_agent_on_mcp_tools(server):
    gin_config.parse(["agent_mcp_scripted"], [])
    try:
        config = AgentConfig()
    finally:
        gin.clear_config()
    assert config.mcp_servers == {"local": ["agentic-jax", "mcp-server"]}
    lines = []
    config = dataclasses.replace(config, mcp_servers={"local": server})  # in-process, for speed
    [result] = run_session(config, [config.task], approver=None, write=lines.append)
    assert result.answer == "The sum of the squares of 1 to 10 is 385."
    assert any(
        line.startswith("[1] tool   local__python ok") and line.endswith(": 385") for line in lines
    )


# ------------------------------------------------------------------------- no call can stop the server
HOSTILE_SERVER = """
import sys, time
from agentic_jax.agents import tool
from agentic_jax.agents.protocols.mcp_server import AgentMCPServer, serve


@tool
def noisy(megabytes: int) -> str:
    \"\"\"Prints to standard output, as careless code does.\"\"\"
    print("x" * (megabytes * 2**20), flush=True)
    sys.stdout.write("no newline: the protocol's next line would begin here")
    sys.stdout.flush()
    return "printed"


@tool
def huge(megabytes: int) -> str:
    \"\"\"Returns megabytes of text.\"\"\"
    return "y" * (megabytes * 2**20)


@tool
def raises(message: str) -> str:
    \"\"\"Raises.\"\"\"
    raise RuntimeError(message)


@tool(timeout_s=0.5)
def hangs() -> str:
    \"\"\"Never returns.\"\"\"
    time.sleep(3600)
    return "never"


serve(AgentMCPServer("hostile", agent_tools=[noisy, huge, raises, hangs], max_result_chars=1000))
"""


def test_tools_that_print_return_megabytes_raise_or_hang_leave_the_stdio_server_serving(tmp_path):
    script = tmp_path / "hostile.py"
    script.write_text(HOSTILE_SERVER)
    with MCPClient({"h": [sys.executable, str(script)]}) as mcp:
        session = mcp.session("h")
        printed = session.call_tool("noisy", {"megabytes": 2})  # went to stderr, not the protocol
        assert not printed.is_error and printed.content[0].text == "printed"
        big = session.call_tool("huge", {"megabytes": 4})
        assert not big.is_error and big.content[0].text.startswith("y" * 1000)
        assert big.content[0].text.endswith(f"... [{4 * 2**20 - 1000} chars cut]")
        failed = session.call_tool("raises", {"message": "boom"})
        assert failed.is_error and failed.content[0].text == "raises failed: RuntimeError: boom"
        hung = session.call_tool("hangs", {})
        assert hung.is_error and hung.content[0].text == "hangs timed out after 0.5s"
        for bad in ({}, {"megabytes": "many"}, {"megabytes": 1, "extra": 2}, {"megabytes": 2**70}):
            assert session.call_tool("huge", bad).is_error or bad == {"megabytes": 2**70}
        with pytest.raises(MCPError, match="unknown tool"):
            session.call_tool("nope", {})
        assert session.call_tool("raises", {"message": "still here"}).is_error
        assert session.connects == 1  # one connection throughout: the server never went down


EXPRESSION = st.text(st.sampled_from("0123456789+-*/() x"), max_size=80)
ARGUMENTS = st.one_of(
    st.fixed_dictionaries({"expression": st.one_of(EXPRESSION, st.text(max_size=300))}),
    st.dictionaries(
        st.text(max_size=10),
        st.one_of(
            st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3)
        ),
        max_size=3,
    ),
)


@settings(max_examples=150, suppress_health_check=list(HealthCheck))
@given(arguments=ARGUMENTS)
def test_fuzz_calculator_arguments_at_the_edges_of_its_schema(local, arguments):
    result = local.call_tool("calculator", arguments)
    assert result.content and isinstance(result.content[0].text, str)
    valid = (
        set(arguments) == {"expression"}
        and len(arguments["expression"]) <= 64
        and isinstance(arguments["expression"], str)
    )
    if not valid:
        assert result.is_error


@pytest.mark.parametrize(
    "code",
    [
        "print('z' * 10**7)",
        "raise SystemExit(3)",
        "import os; os._exit(9)",
        "def f(): return f()\nf()",
        "x = bytearray(2**40)",
        "while True: pass",
        "import sys; sys.stdout.write('\\x00\\xff' * 1000)",
        "print('\\udcff')",
    ],
)
def test_hostile_python_is_an_answer_not_the_end_of_the_server(local, code):
    result = local.call_tool("python", {"code": code})
    assert result.content and len(result.content[0].text) <= 20_000
    assert local.call_tool("calculator", {"expression": "6 * 7"}).content[0].text == "42"
