"""The agent web UI over HTTP (no browser): scripted runs served by uvicorn on loopback, their
typed server-sent events, approvals in three tiers, stop, retry and the run's trace."""

import json

import gin
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from ui_server import serving

from agentic_jax.agents.policies.base import Delta, ScriptedPolicy
from agentic_jax.agents.session import AgentConfig
from agentic_jax.agents.tools.base import tool
from agentic_jax.agents.tools.budget import Budget
from agentic_jax.agents.tools.executor import ToolExecutor
from agentic_jax.agents.ui.app import ui_app
from agentic_jax.agents.ui.runs import agent_work, team_work
from agentic_jax.cli import main
from agentic_jax.data.chat import ToolCall

TASK = "What is 17 * 23?"
CALL = {"name": "calculator", "arguments": {"expression": "17 * 23"}}
SCRIPT = [{"text": "Let me compute it.", "tool_calls": [CALL]}, "17 * 23 = 391."]


def read_events(response: httpx.Response):
    """``(type, data)`` of each server-sent event of a streamed response, as they arrive."""
    type_, data = "message", []
    for line in response.iter_lines():
        if line.startswith("event:"):
            type_ = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif not line and data:
            yield type_, json.loads("\n".join(data))
            type_, data = "message", []


def follow(url: str, run_id: str, on_event=lambda client, type_, data: None):
    """Every event of a run until its end; ``on_event`` may act on each (answer an approval)."""
    seen = []
    with (
        httpx.Client(base_url=url, timeout=30) as client,
        client.stream("GET", f"/api/runs/{run_id}/events") as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        for type_, data in read_events(response):
            seen.append((type_, data))
            on_event(client, type_, data)
    return seen


def start(url: str, task: str = TASK) -> str:
    reply = httpx.post(f"{url}/api/runs", json={"task": task})
    assert reply.status_code == 201, reply.text
    return reply.json()["id"]


def app_for(tmp_path, script=SCRIPT, approval=None, **app_args):
    policy = ScriptedPolicy(script)
    config = AgentConfig(
        policy=policy, tools=["calculator"], approval=approval or {}, budget=Budget(max_steps=6)
    )
    app = ui_app(agent_work(config, policy), trace_path=tmp_path / "trace.jsonl", **app_args)
    return app, policy


def of(events, type_):
    return [data for t, data in events if t == type_]


def test_a_run_streams_tokens_and_a_tool_card_with_its_result(tmp_path):
    app, _ = app_for(tmp_path)
    with serving(app) as url:
        run_id = start(url)
        events = follow(url, run_id)
        # The stream resumes after a given event (an EventSource's Last-Event-ID) and ends.
        with httpx.stream(
            "GET", f"{url}/api/runs/{run_id}/events", headers={"Last-Event-ID": "2"}
        ) as response:
            resumed = list(read_events(response))
    types = [t for t, _ in events]
    assert types[0] == "run_start" and types[-1] == "run_end"
    assert all(data["run"] == run_id for _, data in events)
    first_turn = types[: types.index("model_call")]
    assert "".join(d["text"] for t, d in events[: len(first_turn)] if t == "token") == (
        "Let me compute it."
    )
    [card] = of(events, "tool_call")
    assert card["name"] == "calculator"
    pieces = [d["text"] for d in of(events, "tool_args") if d["card"] == card["card"]]
    assert len(pieces) > 1 and json.loads("".join(pieces)) == CALL["arguments"]
    [result] = of(events, "tool_result")
    assert result["card"] == card["card"] and result["status"] == "ok"
    assert result["content"] == "391" and result["latency_s"] >= 0
    assert types.index("tool_call") < types.index("tool_args") < types.index("tool_result")
    assert of(events, "run_end")[0]["answer"] == "17 * 23 = 391."
    assert resumed == events[3:]


def test_an_ask_tool_waits_for_approval_then_runs(tmp_path):
    app, policy = app_for(tmp_path, approval={"calculator": "ask"})

    def approve(client, type_, data):
        if type_ == "approval_request":
            assert (
                data["name"] == "calculator" and json.loads(data["arguments"]) == CALL["arguments"]
            )
            # Nothing has run yet: the call waits on this answer.
            assert len(policy.calls) == 1
            reply = client.post(
                f"/api/runs/{run_id}/approvals/{data['approval']}", json={"approve": True}
            )
            assert reply.status_code == 200
            again = client.post(
                f"/api/runs/{run_id}/approvals/{data['approval']}", json={"approve": True}
            )
            assert again.status_code == 404  # answered once

    with serving(app) as url:
        run_id = start(url)
        events = follow(url, run_id, approve)
    types = [t for t, _ in events]
    assert (
        types.index("approval_request")
        < types.index("approval_result")
        < types.index("tool_result")
    )
    [request], [verdict] = of(events, "approval_request"), of(events, "approval_result")
    [card] = of(events, "tool_call")
    assert request["card"] == verdict["card"] == card["card"]
    assert verdict["approved"] is True and verdict["by"] == "user"
    assert of(events, "tool_result")[0]["status"] == "ok"
    assert of(events, "run_end")[0]["stop_reason"] == "answer"


@pytest.mark.parametrize("how", ["deny_tier", "deny_click", "timeout"])
def test_a_denied_call_does_not_run_and_the_agent_sees_why(tmp_path, how):
    ran = []

    @tool
    def launch(target: str) -> str:
        """Launch something."""
        ran.append(target)
        return "launched"

    script = [
        {"text": "", "tool_calls": [{"name": "launch", "arguments": {"target": "moon"}}]},
        "ok",
    ]
    policy = ScriptedPolicy(script)
    approval = {"launch": "deny" if how == "deny_tier" else "ask"}
    config = AgentConfig(policy=policy, tools=[], approval=approval)
    app = ui_app(
        agent_work(config, policy, [launch]),
        trace_path=tmp_path / "trace.jsonl",
        approval_timeout_s=0.2 if how == "timeout" else 30,
    )

    def deny(client, type_, data):
        if type_ == "approval_request" and how == "deny_click":
            client.post(f"/api/runs/{run_id}/approvals/{data['approval']}", json={"approve": False})

    with serving(app) as url:
        run_id = start(url, "Launch to the moon.")
        events = follow(url, run_id, deny)
    assert ran == []
    [result] = of(events, "tool_result")
    assert result["status"] == "denied"
    if how == "deny_tier":
        assert of(events, "approval_request") == []
    else:
        [verdict] = of(events, "approval_result")
        assert verdict["approved"] is False
        assert verdict["by"] == ("timeout" if how == "timeout" else "user")
    seen = [m.content for m in policy.calls[1][0] if m.role == "tool"]
    assert seen == [result["content"]] and seen[0].startswith("error: ")


def test_stop_ends_a_run_waiting_for_approval(tmp_path):
    app, policy = app_for(tmp_path, approval={"calculator": "ask"})

    def stop(client, type_, data):
        if type_ == "approval_request":
            assert client.post(f"/api/runs/{run_id}/stop").status_code == 200

    with serving(app) as url:
        run_id = start(url)
        events = follow(url, run_id, stop)
        [verdict] = of(events, "approval_result")
        assert verdict["approved"] is False and verdict["by"] == "stop"
        [end] = of(events, "run_end")
        assert end["stop_reason"] == "stopped" and events[-1][0] == "run_end"
        assert len(policy.calls) == 1  # the model was not asked again
        # Retry runs the task again as a new run (the script goes on with its next turn).
        reply = httpx.post(f"{url}/api/runs/{run_id}/retry")
        assert reply.status_code == 201 and reply.json()["task"] == TASK
        retried = follow(url, reply.json()["id"])
        assert of(retried, "run_end")[0]["answer"] == "17 * 23 = 391."
        runs = httpx.get(f"{url}/api/runs").json()
        assert [r["id"] for r in runs] == [run_id, reply.json()["id"]]
        assert all(r["finished"] for r in runs)


def test_the_trace_endpoint_returns_the_runs_jsonl_events(tmp_path):
    hostile = "<script>alert(1)</script>"
    app, _ = app_for(tmp_path, script=[{"text": hostile, "tool_calls": [CALL]}, hostile])
    with serving(app) as url:
        first, second = start(url), None
        follow(url, first)
        second = start(url)
        follow(url, second)
        reply = httpx.get(f"{url}/api/runs/{first}/trace")
        assert reply.headers["content-type"].startswith("application/x-ndjson")
        events = [json.loads(line) for line in reply.text.splitlines()]
        page = httpx.get(f"{url}/runs/{first}/trace").text
        home = httpx.get(f"{url}/").text
    assert {e["run"] for e in events} == {first}
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end" and "tool_call" in kinds
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
    assert hostile not in page and "&lt;script&gt;" in page
    assert "<li>" in page and "calculator" in page
    assert f'value="{TASK}"' not in home  # the app was given no task
    loaded = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert events == [e for e in loaded if e["run"] == first]


def test_requests_the_ui_refuses(tmp_path):
    app, _ = app_for(tmp_path, approval={"calculator": "ask"}, task="<b>a task</b>")

    def check(client, type_, data):
        if type_ == "approval_request":
            busy = client.post("/api/runs", json={"task": "another"})
            assert busy.status_code == 409 and run_id in busy.json()["error"]
            wrong = client.post(
                f"/api/runs/{run_id}/approvals/{data['approval']}", json={"approve": "yes"}
            )
            assert wrong.status_code == 400
            missing = client.post(f"/api/runs/{run_id}/approvals/nope", json={"approve": True})
            assert missing.status_code == 404
            client.post(f"/api/runs/{run_id}/approvals/{data['approval']}", json={"approve": True})

    with serving(app) as url:
        home = httpx.get(f"{url}/").text
        assert 'value="&lt;b&gt;a task&lt;/b&gt;"' in home
        assert httpx.post(f"{url}/api/runs", content=b"[1]").status_code == 400
        assert httpx.post(f"{url}/api/runs", content=b"{").status_code == 400
        assert httpx.post(f"{url}/api/runs", json={"task": " "}).status_code == 400
        assert httpx.get(f"{url}/api/runs/nope/events").status_code == 404
        assert httpx.get(f"{url}/static/ui.js").status_code == 200
        run_id = httpx.post(f"{url}/api/runs", json={}).json()["id"]  # the default task
        events = follow(url, run_id, check)
        bad = httpx.get(f"{url}/api/runs/{run_id}/events", params={"after": "x"})
        assert bad.status_code == 400
    assert of(events, "run_start")[0]["task"] == "<b>a task</b>"


def test_a_team_run_shows_its_members_messages(tmp_path):
    gin.clear_config()
    import agentic_jax.registry  # noqa: F401
    from agentic_jax import config as gin_config
    from agentic_jax.agents.multi_agent.session import TeamConfig

    gin_config.parse(["research_scripted"], [])
    try:
        team = TeamConfig()
    finally:
        gin.clear_config()
    app = ui_app(team_work(team.team), trace_path=tmp_path / "trace.jsonl", task=team.task)
    with serving(app) as url:
        events = follow(url, httpx.post(f"{url}/api/runs", json={}).json()["id"])
    messages = of(events, "message")
    assert {"planner", "researcher", "writer", "critic"} <= {m["sender"] for m in messages}
    cards, results = of(events, "tool_call"), of(events, "tool_result")
    assert [c["name"] for c in cards] == ["search", "search"]
    assert [r["card"] for r in results] == [c["card"] for c in cards]
    assert {c["agent"] for c in cards} == {"researcher"}
    assert of(events, "run_end")[0]["stop_reason"] == "answer"


def test_the_ui_verb_serves_the_shipped_scripted_config(tmp_path, monkeypatch):
    import uvicorn

    served = []

    def run_once(app, host, port):
        with serving(app) as url:
            served.append(follow(url, httpx.post(f"{url}/api/runs", json={}).json()["id"], approve))

    def approve(client, type_, data):
        if type_ == "approval_request":
            client.post(
                f"/api/runs/{data['run']}/approvals/{data['approval']}", json={"approve": True}
            )

    monkeypatch.setattr(uvicorn, "run", run_once)
    try:
        assert main(["ui", "--gin_file", "ui_scripted", "--trace", str(tmp_path / "t.jsonl")]) == 0
    finally:
        gin.clear_config()
    [events] = served
    assert [r["status"] for r in of(events, "tool_result")] == ["ok", "ok"]
    assert of(events, "approval_result")[0]["approved"] is True
    assert of(events, "run_end")[0]["stop_reason"] == "answer"


def test_approval_tiers_of_the_executor():
    @tool(dangerous=True)
    def wipe(path: str) -> str:
        """Delete a file."""
        return f"wiped {path}"

    asked = []

    def approver(tool_, call):
        asked.append(call.name)
        return True

    call = ToolCall("wipe", {"path": "x"})
    assert ToolExecutor([wipe], approver=approver).execute(call).ok and asked == ["wipe"]
    assert ToolExecutor([wipe], approver=approver, approval={"wipe": "auto"}).execute(call).ok
    denied = ToolExecutor([wipe], approver=approver, approval={"wipe": "deny"}).execute(call)
    assert denied.status == "denied" and "may not be used" in denied.content
    assert asked == ["wipe"]  # neither auto nor deny asks
    with pytest.raises(ValueError, match="'sometimes' of tool 'wipe'"):
        ToolExecutor([wipe], approval={"wipe": "sometimes"})


@given(
    text=st.text(max_size=40),
    arguments=st.dictionaries(st.text(max_size=5), st.text(max_size=12), max_size=3),
)
def test_scripted_streaming_pieces_join_to_the_turn(text, arguments):
    policy = ScriptedPolicy([{"text": text, "tool_calls": [{"name": "f", "arguments": arguments}]}])
    pieces: list[Delta] = []
    turn = policy.respond_streaming([], [], pieces.append)
    assert "".join(p.text for p in pieces if p.call is None) == turn.text == text
    call_pieces = [p for p in pieces if p.call == 0]
    assert call_pieces[0].name == "f" and all(not p.name for p in call_pieces[1:])
    assert json.loads("".join(p.arguments for p in call_pieces)) == arguments
