"""The agent web UI's retry from a step, over HTTP: the new run replays the steps before it from
the old run's record (the policy is not asked, the tools are not run, ``ask``-tier calls are not
asked about again) and goes on live from that step, linked to the old run in its events, the
run list and the trace."""

import json

import httpx
from test_agents_ui import follow, of, start
from ui_server import serving

from agentic_jax.agents.policies.base import ScriptedPolicy
from agentic_jax.agents.session import AgentConfig
from agentic_jax.agents.tools.base import tool
from agentic_jax.agents.ui.app import ui_app
from agentic_jax.agents.ui.runs import agent_work


def counting(x: int) -> dict:
    return {"text": f"count {x}", "tool_calls": [{"name": "count", "arguments": {"x": x}}]}


def counting_app(tmp_path, script, loop="react"):
    """A scripted agent with one ``ask``-tier tool that records its calls in ``ran``."""
    ran = []

    @tool
    def count(x: int) -> str:
        """Counts."""
        ran.append(x)
        return f"counted {x}"

    policy = ScriptedPolicy(script)
    config = AgentConfig(policy=policy, tools=[], approval={"count": "ask"}, loop=loop)
    app = ui_app(agent_work(config, policy, [count]), trace_path=tmp_path / "trace.jsonl")
    return app, policy, ran


def approving(asked):
    def on_event(client, type_, data):
        if type_ == "approval_request":
            asked.append(json.loads(data["arguments"])["x"])
            client.post(
                f"/api/runs/{data['run']}/approvals/{data['approval']}", json={"approve": True}
            )

    return on_event


def retry(url, run_id, **body):
    reply = httpx.post(f"{url}/api/runs/{run_id}/retry", json=body)
    assert reply.status_code == 201, reply.text
    return reply.json()


def test_a_retry_from_a_step_replays_the_steps_before_it_and_reruns_from_there(tmp_path):
    script = [counting(1), counting(2), "done", counting(3), "done again", "done thrice"]
    app, policy, ran = counting_app(tmp_path, script)
    asked = []
    with serving(app) as url:
        first = start(url, "Count.")
        follow(url, first, approving(asked))
        assert ran == [1, 2] and len(policy.calls) == 3

        # From model turn 2: turn 1 and its call are replayed; the policy is asked at turn 2.
        second = retry(url, first, step=2)
        assert second["retry_of"] == first and second["from_step"] == 2
        assert second["from_call"] is None and second["task"] == "Count."
        events = follow(url, second["id"], approving(asked))
        assert ran == [1, 2, 3] and asked == [1, 2, 3]  # count(1) neither ran nor was asked
        assert len(policy.calls) == 5
        assert policy.calls[3][0] == policy.calls[1][0]  # the same conversation at turn 2
        [begin] = of(events, "run_start")
        assert (begin["retry_of"], begin["from_step"], begin["from_call"]) == (first, 2, None)
        turns = of(events, "model_call")
        assert [(t["step"], t.get("replayed", False)) for t in turns] == [
            (1, True),
            (2, False),
            (3, False),
        ]
        results = of(events, "tool_result")
        assert [(r["arguments"]["x"], r.get("replayed", False)) for r in results] == [
            (1, True),
            (3, False),
        ]
        assert of(events, "run_end")[0]["answer"] == "done again"

        # From the tool call of turn 2 of the retry (a retry of a retry): the turn is replayed,
        # its call runs again, and the policy is next asked at turn 3.
        third = retry(url, second["id"], step=2, call=0)
        events = follow(url, third["id"], approving(asked))
        assert ran == [1, 2, 3, 3] and len(policy.calls) == 6
        assert policy.calls[5][0] == policy.calls[4][0]  # the same conversation at turn 3
        assert [t.get("replayed", False) for t in of(events, "model_call")] == [True, True, False]
        assert of(events, "run_end")[0]["answer"] == "done thrice"

        runs = httpx.get(f"{url}/api/runs").json()
        trace = [json.loads(line) for line in (tmp_path / "trace.jsonl").read_text().splitlines()]
    assert [(r["id"], r.get("retry_of"), r.get("from_call")) for r in runs] == [
        (first, None, None),
        (second["id"], first, None),
        (third["id"], second["id"], 0),
    ]
    [begin] = [e for e in trace if e["run"] == third["id"] and e["kind"] == "run_start"]
    assert (begin["retry_of"], begin["from_step"], begin["from_call"]) == (second["id"], 2, 0)
    # The trace of a retry holds every step, replayed or not, with the model turns' numbers.
    steps = [e["step"] for e in trace if e["run"] == third["id"] and e["kind"] == "model_call"]
    assert steps == [1, 2, 3]


def test_a_retry_from_a_step_it_cannot_replay_is_refused(tmp_path):
    app, _, _ = counting_app(tmp_path, [counting(1), "done", "again"])
    with serving(app) as url:
        run_id = start(url, "Count.")
        follow(url, run_id, approving([]))
        for body, message in [
            ({"step": 3}, "finished model turns 1 to 2, not 3"),
            ({"step": 0}, "not 0"),
            ({"step": 1, "call": 1}, "made 1 calls, not call 1"),
            ({"step": "1"}, "'step' must be an integer"),
            ({"step": True}, "'step' must be an integer"),
            ({"call": 0}, "'call' needs the 'step'"),
        ]:
            reply = httpx.post(f"{url}/api/runs/{run_id}/retry", json=body)
            assert reply.status_code == 400 and message in reply.json()["error"], body
        assert len(httpx.get(f"{url}/api/runs").json()) == 1  # nothing started
        again = retry(url, run_id)  # the whole task, as before
        assert "retry_of" not in again
        assert of(follow(url, again["id"]), "run_end")[0]["answer"] == "again"


def test_only_a_react_run_retries_from_a_step(tmp_path):
    plan = "1. Count to one."
    app, _, _ = counting_app(tmp_path, [plan, "counted", "done"], loop="plan_execute")
    with serving(app) as url:
        run_id = start(url, "Count.")
        follow(url, run_id)
        reply = httpx.post(f"{url}/api/runs/{run_id}/retry", json={"step": 1})
    assert reply.status_code == 400
    assert "is a plan_execute run: only a ReAct run" in reply.json()["error"]
