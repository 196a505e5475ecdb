"""A2A: the SDK's own client against our server (in-process over httpx's ASGI transport), and our
delegation client against a server built directly with the SDK."""

import asyncio
import json
import threading
import time

import httpx
import pydantic
import pytest
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.helpers import get_artifact_text, get_message_text, new_data_part
from a2a.server.agent_execution import AgentExecutor
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict
from mcp.server import MCPServer
from starlette.applications import Starlette
from starlette.responses import JSONResponse

from agentic_jax.agents import (
    END,
    ReActAgent,
    ScriptedPolicy,
    StateGraph,
    ToolError,
    ToolExecutor,
    tool,
)
from agentic_jax.agents.protocols.a2a_client import (
    DelegationError,
    RemoteAgent,
    delegate_node,
    delegate_tool,
)
from agentic_jax.agents.protocols.a2a_server import A2AServerConfig, a2a_app, agent_card, config_app
from agentic_jax.agents.protocols.mcp_client import MCPClient
from agentic_jax.agents.protocols.skills import SkillRegistry
from agentic_jax.agents.session import AgentConfig
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.agents.tools.executor import RetryPolicy
from agentic_jax.cli import _parser
from agentic_jax.data.chat import ToolCall

BASE = "http://agent.test"
ANSWER = "17 * 23 + 100 = 491."
CALC = [
    {
        "text": "First 17 * 23.",
        "tool_calls": [{"name": "calculator", "arguments": {"expression": "17 * 23"}}],
    },
    {"tool_calls": [{"name": "calculator", "arguments": {"expression": "391 + 100"}}]},
    ANSWER,
]
S = TaskState


def call(name, **arguments):
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def serve(policy, tools=(calculator,), **app_args):
    """Our server around a ReAct agent over ``policy``, with the task's harness tools."""

    def make(setup):
        executor = ToolExecutor([*tools, *setup.tools], approver=setup.approver)
        return ReActAgent(policy, executor, tracer=setup.tracer)

    return a2a_app(make, agent_card("calc", "Integer arithmetic.", BASE, tools=tools), **app_args)


def scenario(app, body, *, headers=None, **config):
    """Runs ``body(client, http)`` with the SDK's client for ``app`` (resolved from its card)."""

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), headers=headers) as http:
            card = await A2ACardResolver(http, BASE).get_agent_card()
            client = ClientFactory(ClientConfig(httpx_client=http, **config)).create(card)
            return await body(client, http)

    return asyncio.run(main())


def user(text, task_id="", data=None):
    part = Part(text=text) if data is None else new_data_part(data)
    return SendMessageRequest(
        message=Message(role=Role.ROLE_USER, message_id=f"m-{text}", task_id=task_id, parts=[part])
    )


async def collect(client, request):
    return [r async for r in client.send_message(request)]


def states(responses):
    out = []
    for r in responses:
        if r.HasField("task"):
            out.append(r.task.status.state)
        elif r.HasField("status_update"):
            out.append(r.status_update.status.state)
        elif r.HasField("artifact_update"):
            out.append("artifact")
    return out


def last_task(responses) -> str:
    return next(
        r.task.id if r.HasField("task") else r.status_update.task_id
        for r in responses
        if r.HasField("task") or r.HasField("status_update")
    )


# ------------------------------------------------------------------------------ our server
def test_card_lists_skills_or_tools_interfaces_and_streaming():
    skills = SkillRegistry.load().skills()
    app = a2a_app(lambda s: None, agent_card("calc", "Arithmetic.", BASE, skills=skills))

    async def body(client, http):
        return await A2ACardResolver(http, BASE).get_agent_card()

    card = scenario(app, body)
    assert [s.id for s in card.skills] == ["arithmetic", "python-analysis", "summarization"]
    assert list(card.skills[0].examples) == list(skills[0].examples)
    assert "calculator" in card.skills[0].tags and card.capabilities.streaming
    assert {(i.protocol_binding, i.url) for i in card.supported_interfaces} == {
        ("JSONRPC", BASE + "/"),
        ("HTTP+JSON", BASE + "/rest"),
    }
    assert not card.security_requirements
    assert [s.id for s in agent_card("c", "d", BASE, tools=[calculator]).skills] == ["calculator"]
    assert [s.id for s in agent_card("c", "d", BASE).skills] == ["general"]


def test_send_completes_with_the_answer_as_artifact_and_get_task_agrees():
    policy = ScriptedPolicy(CALC)

    async def body(client, http):
        (response,) = await collect(client, user("What is 17 * 23 + 100?"))
        task = await client.get_task(GetTaskRequest(id=response.task.id))
        return response.task, task

    sent, fetched = scenario(serve(policy), body, streaming=False)
    for task in (sent, fetched):
        assert task.status.state == S.TASK_STATE_COMPLETED
        assert [get_artifact_text(a) for a in task.artifacts] == [ANSWER]
        assert get_message_text(task.history[0]) == "What is 17 * 23 + 100?"
    assert fetched.status.message.parts[0].text == ANSWER
    assert len(policy.calls) == 3


def test_stream_reports_each_step_then_the_artifact_then_completion():
    async def body(client, http):
        return await collect(client, user("What is 17 * 23 + 100?"))

    responses = scenario(serve(ScriptedPolicy(CALC)), body)
    seen = states(responses)
    assert seen[0] == S.TASK_STATE_SUBMITTED and seen[-2:] == ["artifact", S.TASK_STATE_COMPLETED]
    assert set(seen[1:-2]) == {S.TASK_STATE_WORKING}
    updates = [r.status_update for r in responses if r.HasField("status_update")]
    events = [MessageToDict(u.metadata).get("event", {}) for u in updates]
    tools = [(u, e) for u, e in zip(updates, events) if e.get("kind") == "tool_call"]
    assert "tool   calculator ok" in get_message_text(tools[0][0].status.message)
    assert [e["content"] for _, e in tools] == ["391", "491"]
    assert MessageToDict(updates[-1].metadata)["stop_reason"] == "answer"
    assert get_artifact_text(responses[-2].artifact_update.artifact) == ANSWER


def test_input_required_then_a_follow_up_on_the_task_completes_it():
    policy = ScriptedPolicy([call("ask_user", question="What should I add to 17 * 23?"), *CALC])

    async def body(client, http):
        first = await collect(client, user("Add something to 17 * 23."))
        task_id = last_task(first)
        second = await collect(client, user("100", task_id=task_id))
        return first, second, await client.get_task(GetTaskRequest(id=task_id))

    first, second, task = scenario(serve(policy), body)
    assert states(first)[-1] == S.TASK_STATE_INPUT_REQUIRED
    assert (
        get_message_text(first[-1].status_update.status.message) == "What should I add to 17 * 23?"
    )
    assert states(second)[0] == S.TASK_STATE_WORKING
    assert states(second)[-1] == S.TASK_STATE_COMPLETED
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert [get_artifact_text(a) for a in task.artifacts] == [ANSWER]
    assert policy.calls[1][0][-1].content == "100"  # the reply is the ask_user tool's result
    assert {r.status_update.context_id for r in first + second if r.HasField("status_update")} == {
        task.context_id
    }
    assert "100" in [get_message_text(m) for m in task.history if m.role == Role.ROLE_USER]


def test_failures_end_the_task_failed_with_the_reason():
    async def body(client, http):
        (response,) = await collect(client, user("What is 17 * 23 + 100?"))
        return response.task

    ran_out = scenario(serve(ScriptedPolicy(CALC[:1])), body, streaming=False)
    assert ran_out.status.state == S.TASK_STATE_FAILED
    assert get_message_text(ran_out.status.message).startswith("policy_error: ScriptedPolicy has")
    assert not ran_out.artifacts

    def broken(setup):
        raise RuntimeError("no model loaded")

    crashed = scenario(a2a_app(broken, agent_card("c", "d", BASE)), body, streaming=False)
    assert crashed.status.state == S.TASK_STATE_FAILED
    assert (
        get_message_text(crashed.status.message)
        == "the agent crashed: RuntimeError: no model loaded"
    )


def test_declined_tasks_and_textless_messages_are_rejected():
    policy = ScriptedPolicy(
        [call("decline_task", reason="I only do arithmetic."), "Sorry, I cannot help with that."]
    )

    async def body(client, http):
        (declined,) = await collect(client, user("Write me a poem."))
        (empty,) = await collect(client, user("", data={"x": 1}))
        return declined.task, empty.task

    declined, empty = scenario(serve(policy), body, streaming=False)
    assert declined.status.state == S.TASK_STATE_REJECTED
    assert get_message_text(declined.status.message) == "I only do arithmetic."
    assert empty.status.state == S.TASK_STATE_REJECTED
    assert "no text part" in get_message_text(empty.status.message)
    assert len(policy.calls) == 2


async def eventually(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not await predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("waits_for_input", [False, True])
def test_cancel_stops_the_run_at_its_next_step(waits_for_input):
    started, release = threading.Event(), threading.Event()

    @tool(timeout_s=None)
    def slow() -> str:
        """Takes until released."""
        started.set()
        release.wait(10)
        return "done"

    first = call("ask_user", question="Which?") if waits_for_input else call("slow")
    policy, tracers = ScriptedPolicy([first, "finished"]), []

    def make(setup):
        tracers.append(setup.tracer)
        return ReActAgent(policy, [slow, *setup.tools], tracer=setup.tracer)

    parked = S.TASK_STATE_INPUT_REQUIRED if waits_for_input else S.TASK_STATE_WORKING

    async def body(client, http):
        (response,) = await collect(client, user("go"))
        task_id = response.task.id

        async def in_state():
            task = await client.get_task(GetTaskRequest(id=task_id))
            return task.status.state == parked and (waits_for_input or started.is_set())

        async def tool_returned():  # the run's next step, where it stops
            return any(e["kind"] == "tool_call" for e in tracers[0].events)

        await eventually(in_state)
        canceled = await client.cancel_task(CancelTaskRequest(id=task_id))
        release.set()
        await eventually(tool_returned)
        with pytest.raises(A2AError, match="terminal state"):  # it takes no more messages
            await collect(client, user("more", task_id=task_id))
        return canceled, await client.get_task(GetTaskRequest(id=task_id))

    canceled, task = scenario(
        a2a_app(make, agent_card("c", "d", BASE)), body, streaming=False, polling=True
    )
    assert canceled.status.state == task.status.state == S.TASK_STATE_CANCELED
    assert len(policy.calls) == 1  # no model call after the cancel


def test_an_unanswered_question_times_out_and_a_late_reply_fails_the_task():
    policy = ScriptedPolicy([call("ask_user", question="Which?"), "finished"])
    app = serve(policy, input_timeout_s=0.1)

    async def body(client, http):
        first = await collect(client, user("go"))
        await asyncio.sleep(0.3)
        return first, await collect(client, user("late", task_id=last_task(first)))

    first, late = scenario(app, body)
    assert states(first)[-1] == S.TASK_STATE_INPUT_REQUIRED
    assert states(late)[-1] == S.TASK_STATE_FAILED
    assert "No run of this task is waiting for input" in get_message_text(
        late[-1].status_update.status.message
    )
    assert len(policy.calls) == 1


def test_dangerous_tools_ask_the_client_for_approval():
    ran = []

    @tool(dangerous=True)
    def launch(target: str) -> str:
        """Launches something."""
        ran.append(target)
        return "launched"

    policy = ScriptedPolicy([call("launch", target="moon"), "Launched."])

    async def body(client, http):
        first = await collect(client, user("Launch to the moon."))
        second = await collect(client, user("yes", task_id=last_task(first)))
        return first, second

    first, second = scenario(serve(policy, (launch,)), body)
    assert states(first)[-1] == S.TASK_STATE_INPUT_REQUIRED
    assert "Approve running launch" in get_message_text(first[-1].status_update.status.message)
    assert states(second)[-1] == S.TASK_STATE_COMPLETED and ran == ["moon"]


def test_http_json_binding_and_bearer_authentication():
    app = serve(ScriptedPolicy(CALC), bearer_token="s3cret")

    async def unauthorized(client, http):
        card = await A2ACardResolver(http, BASE).get_agent_card()  # the card stays public
        response = await http.post(
            BASE + "/", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        )
        return card, response.status_code

    card, status = scenario(app, unauthorized)
    assert status == 401
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(card.security_requirements[0].schemes) == ["bearer"]

    async def body(client, http):
        (response,) = await collect(client, user("What is 17 * 23 + 100?"))
        return response.task

    task = scenario(
        app,
        body,
        headers={"Authorization": "Bearer s3cret"},
        streaming=False,
        supported_protocol_bindings=["HTTP+JSON"],
    )
    assert task.status.state == S.TASK_STATE_COMPLETED
    assert get_artifact_text(task.artifacts[0]) == ANSWER


def test_config_app_selects_skills_per_task_and_the_cli_verb_parses():
    policy = ScriptedPolicy(CALC)
    config = AgentConfig(policy=policy, tools=[])
    app = config_app(BASE, config, A2AServerConfig(skills="builtin", skills_k=1), policy)

    async def body(client, http):
        card = await A2ACardResolver(http, BASE).get_agent_card()
        (response,) = await collect(client, user("What is 17 * 23 + 100?"))
        return card, response.task

    card, task = scenario(app, body, streaming=False)
    assert [s.id for s in card.skills] == ["arithmetic", "python-analysis", "summarization"]
    assert get_artifact_text(task.artifacts[0]) == ANSWER
    system = policy.calls[0][0][0].content
    assert "## Skill: arithmetic" in system and "summarization" not in system
    assert sorted(policy.calls[0][1]) == ["ask_user", "calculator", "decline_task"]
    args = _parser().parse_args(
        [
            "a2a-server",
            "--gin_file",
            "agent_calculator_scripted",
            "--port",
            "9000",
            "--bearer_token_env",
            "TOKEN",
        ]
    )
    assert (args.verb, args.port, args.bearer_token_env) == ("a2a-server", 9000, "TOKEN")


def test_config_app_gives_served_agents_the_configured_mcp_tools():
    """``agentic-jax a2a-server`` lists ``AgentConfig.mcp_servers``' tools once; every task's
    agent gets them, and without skills the card names them."""
    server = MCPServer("words")

    @server.tool()
    def shout(text: str) -> str:
        """Upper-cases text."""
        return text.upper()

    policy = ScriptedPolicy([call("words__shout", text="hi"), "HI"])
    config = AgentConfig(policy=policy, tools=["calculator"])
    with MCPClient({"words": server}) as mcp:
        app = config_app(BASE, config, A2AServerConfig(), policy, mcp_tools=mcp.tools())

        async def body(client, http):
            card = await A2ACardResolver(http, BASE).get_agent_card()
            (response,) = await collect(client, user("Shout hi."))
            return card, response.task

        card, task = scenario(app, body, streaming=False)
    assert [s.id for s in card.skills] == ["calculator", "words__shout"]
    assert get_artifact_text(task.artifacts[0]) == "HI"
    assert "words__shout" in policy.calls[0][1]
    assert policy.calls[1][0][-1].content == "HI"  # the MCP server's answer reached the model


# ------------------------------------------------------------------------ delegation client
class EchoExecutor(AgentExecutor):
    """An SDK agent: upper-cases the text; 'fail', 'reject', 'ask' and 'hang' do just that; the
    answer to its question completes the task.  Records the API key each request carried."""

    def __init__(self):
        self.keys, self.canceled = [], []

    async def execute(self, context, event_queue):
        self.keys.append(context.call_context.state["headers"].get("x-api-key"))
        task = context.current_task
        updater = TaskUpdater(
            event_queue, context.task_id, task.context_id if task else context.context_id
        )
        text = context.get_user_input()

        def say(words):
            return updater.new_agent_message([Part(text=words)])

        if task is None:
            await event_queue.enqueue_event(
                Task(
                    id=context.task_id,
                    context_id=context.context_id,
                    status=TaskStatus(state=S.TASK_STATE_SUBMITTED),
                    history=[context.message],
                )
            )
        if task is not None:
            await updater.add_artifact([Part(text=f"got {text}")], name="answer")
            await updater.complete()
        elif text == "fail":
            await updater.failed(say("disk full"))
        elif text == "reject":
            await updater.reject(say("not my job"))
        elif text == "ask":
            await updater.requires_input(say("Which city?"))
        elif text == "hang":
            await updater.start_work()
            await asyncio.sleep(30)
        else:
            await updater.start_work()
            await updater.add_artifact([Part(text=text.upper())], name="answer")
            await updater.complete()

    async def cancel(self, context, event_queue):
        self.canceled.append(context.task_id)
        await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


def echo_server(streaming=True):
    """An A2A server made with the SDK alone, refusing requests without the API key."""
    card = AgentCard(
        name="Echo agent",
        description="Shouts back.",
        version="1",
        supported_interfaces=[
            AgentInterface(
                url="http://echo.test/", protocol_binding="JSONRPC", protocol_version="1.0"
            )
        ],
        capabilities=AgentCapabilities(streaming=streaming),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id="shout", name="shout", description="Upper-cases text.", tags=["text"])
        ],
    )
    executor = EchoExecutor()
    handler = DefaultRequestHandler(executor, InMemoryTaskStore(), card)
    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/")])

    async def guarded(scope, receive, send):
        headers = dict(scope.get("headers", []))
        if scope["type"] == "http" and headers.get(b"x-api-key") != b"k3y":
            await JSONResponse({"error": "unauthorized"}, status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded, executor


def remote(app, **kwargs):
    return RemoteAgent(
        "http://echo.test",
        headers={"X-API-Key": "k3y"},
        transport=httpx.ASGITransport(app),
        **kwargs,
    )


def test_delegate_tool_in_a_react_loop_passes_the_auth_header():
    app, executor = echo_server()
    with remote(app) as agent:
        delegate = delegate_tool(agent)
        assert delegate.name == "ask_echo_agent"
        assert "Echo agent" in delegate.description and "shout: Upper-cases" in delegate.description
        policy = ScriptedPolicy([call("ask_echo_agent", task="hello there"), "It said HELLO."])
        result = ReActAgent(policy, [delegate]).run("Ask the echo agent.")
    assert result.ok and policy.calls[1][0][-1].content == "HELLO THERE"
    assert executor.keys == ["k3y"]


def test_delegate_tool_surfaces_failed_rejected_and_input_required():
    app, _ = echo_server()
    with remote(app) as agent:
        delegate = delegate_tool(agent, name="echo")
        with pytest.raises(ToolError, match="'Echo agent' failed: disk full"):
            delegate(task="fail")
        with pytest.raises(ToolError, match="declined the task: not my job"):
            delegate(task="reject")
        question = delegate(task="ask")
        assert "needs more input: Which city?" in question and "call echo again" in question
        task_id = question.split("task_id='")[1].split("'")[0]
        assert delegate(task="Oslo", task_id=task_id) == "got Oslo"


def test_polling_a_non_streaming_agent_and_timeouts_cancel_the_remote_task():
    app, executor = echo_server(streaming=False)
    with remote(app, poll_interval_s=0.01) as agent:
        assert agent.send("quiet").text == "QUIET"
    with remote(app, timeout_s=0.5, poll_interval_s=0.01) as agent:
        started = time.monotonic()
        with pytest.raises(DelegationError, match=r"did not settle the task within 0\.5s"):
            agent.send("hang")
        assert time.monotonic() - started < 5
    assert len(executor.canceled) == 1


def test_missing_credentials_fail_at_card_resolution():
    app, _ = echo_server()
    agent = RemoteAgent("http://echo.test", transport=httpx.ASGITransport(app))
    with pytest.raises(DelegationError, match=r"could not resolve the agent card.*401") as error:
        delegate_tool(agent)
    assert not error.value.transient
    agent.close()


def test_close_stops_the_loop_thread_even_when_closing_the_connection_fails():
    class Broken:
        async def close(self):
            raise RuntimeError("connection already gone")

    agent = RemoteAgent("http://echo.test")
    agent._client, agent._http = Broken(), httpx.AsyncClient()
    with pytest.raises(RuntimeError, match="already gone"):
        agent.close()
    assert agent._http.is_closed and not agent._thread.is_alive() and agent._loop.is_closed()
    agent.close()  # and a second close is a no-op


class Flaky(httpx.AsyncBaseTransport):
    """``app``'s transport, refusing the first ``refusals`` requests of ``method``."""

    def __init__(self, app, method, refusals):
        self.inner, self.method, self.refusals = httpx.ASGITransport(app), method, refusals

    async def handle_async_request(self, request):
        if request.method == self.method and self.refusals:
            self.refusals -= 1
            raise httpx.ConnectError("connection refused", request=request)
        return await self.inner.handle_async_request(request)


@pytest.mark.parametrize("streaming", [True, False])
def test_network_failures_are_transient_so_the_executor_retries(streaming):
    app, _ = echo_server()
    down = RemoteAgent("http://echo.test", transport=Flaky(app, "GET", 1))
    with down, pytest.raises(DelegationError, match="agent card") as error:
        delegate_tool(down)
    assert error.value.transient
    with RemoteAgent(
        "http://echo.test",
        headers={"X-API-Key": "k3y"},
        streaming=streaming,
        transport=Flaky(app, "POST", 1),
    ) as agent:
        executor = ToolExecutor(
            [delegate_tool(agent)], retry=RetryPolicy(max_attempts=2, base_delay_s=0.01)
        )
        done = executor.execute(ToolCall("ask_echo_agent", {"task": "again"}))
    assert (done.status, done.content, done.attempts) == ("ok", "AGAIN", 2)


class Flow(pydantic.BaseModel):
    input: str
    output: str = ""
    status: str = ""
    task: str = ""


def test_delegate_node_in_a_state_graph_routes_on_the_remote_state():
    app, _ = echo_server()
    with remote(app) as agent:
        graph = (
            StateGraph(Flow)
            .add_node("delegate", delegate_node(agent, state_key="status", task_key="task"))
            .add_node("fallback", lambda s: {"output": "handled locally"})
            .add_conditional_edges(
                "delegate", lambda s: "fallback" if s.status == "failed" else END
            )
            .compile()
        )
        assert graph.invoke({"input": "hi"}).state.output == "HI"
        failed = graph.invoke({"input": "fail"})
        assert failed.path == ("delegate", "fallback") and failed.state.status == "failed"
        asked = graph.invoke({"input": "ask"}).state
        assert (asked.status, asked.output) == ("input-required", "Which city?")
        answered = graph.invoke({"input": "Rome", "task": asked.task}).state
        assert (answered.status, answered.output) == ("completed", "got Rome")
        strict = StateGraph(Flow).add_node("delegate", delegate_node(agent)).compile()
        with pytest.raises(DelegationError, match="ended rejected: not my job") as error:
            strict.invoke({"input": "reject"})
        assert error.value.result.state == "rejected"


# ------------------------------------------------------------------------------ no request can stop it
def rpc_body(method, params, id_=1):
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def text_message(text, message_id, task_id=None):
    message = {"role": "ROLE_USER", "messageId": message_id, "parts": [{"text": text}]}
    return {"message": {**message, **({"taskId": task_id} if task_id else {})}}


def raw_rpc(app, bodies):
    """Posts each body (bytes, or an object sent as JSON) to the JSON-RPC route, concurrently;
    returns ``(status, parsed reply)`` for each."""

    async def main():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url=BASE) as http:

            async def post(body):
                content = body if isinstance(body, bytes) else json.dumps(body).encode()
                reply = await http.post(
                    "/",
                    content=content,
                    headers={"Content-Type": "application/json", "A2A-Version": "1.0"},
                )
                return reply.status_code, reply.json()

            return await asyncio.gather(*map(post, bodies))

    return asyncio.run(main())


@pytest.mark.parametrize(
    "raw, code",
    [
        (b"\xff\xfe\x00", -32700),
        (b"[" * 5000 + b"]" * 5000, -32700),
        (b"{not json", -32700),
        (b"[]", -32600),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600),
    ],
)
def test_malformed_json_rpc_is_a_client_error_not_an_internal_one(raw, code):
    [(status, reply)] = raw_rpc(serve(ScriptedPolicy([ANSWER])), [raw])
    assert status == 200 and reply["error"]["code"] == code


def test_malformed_messages_unknown_tasks_and_late_cancels_never_wedge_the_server():
    app = serve(ScriptedPolicy([ANSWER] * 50))
    malformed = [
        rpc_body("Nope", {}),
        rpc_body("SendMessage", {}),
        rpc_body("SendMessage", {"message": 5}),
        rpc_body("SendMessage", {"message": {"parts": "x"}}),
        rpc_body("SendMessage", {"message": {"role": "ROLE_USER", "parts": [{}]}}),
        rpc_body("GetTask", {"id": "no-such-task"}),
        rpc_body("CancelTask", {"id": "no-such-task"}),
        rpc_body("SendMessage", text_message("hi", "m0", task_id="no-such-task")),
    ]
    replies = raw_rpc(app, malformed)
    assert all(status == 200 and "error" in reply for status, reply in replies)
    codes = [reply["error"]["code"] for _, reply in replies]
    assert codes[0] == -32601 and all(c != -32603 for c in codes)  # never "internal error"
    assert codes[5:] == [-32001, -32001, -32001]  # task not found
    [(_, done)] = raw_rpc(app, [rpc_body("SendMessage", text_message("What?", "m1"))])
    task = done["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    cancel, follow_up = raw_rpc(
        app,
        [
            rpc_body("CancelTask", {"id": task["id"]}),
            rpc_body("SendMessage", text_message("more", "m2", task_id=task["id"])),
        ],
    )
    assert cancel[1]["error"]["code"] == -32002  # a finished task cannot be canceled
    assert "terminal state" in follow_up[1]["error"]["message"]


def test_a_burst_of_concurrent_tasks_all_complete():
    app = serve(ScriptedPolicy([ANSWER] * 40))
    replies = raw_rpc(
        app, [rpc_body("SendMessage", text_message("go", f"b{i}"), i) for i in range(40)]
    )
    tasks = [reply["result"]["task"] for _, reply in replies]
    assert {t["status"]["state"] for t in tasks} == {"TASK_STATE_COMPLETED"}
    assert len({t["id"] for t in tasks}) == 40
    [(status, over)] = raw_rpc(
        a2a_app(lambda setup: None, agent_card("a", "b", BASE), max_request_bytes=100),
        [rpc_body("SendMessage", text_message("x" * 200, "big"))],
    )
    assert (
        status == 200
        and over["error"]["code"] == -32700
        and "at most 100" in over["error"]["message"]
    )
