"""Tracing, golden-trajectory regression, and the agent/trace CLI verbs on a scripted policy."""

import concurrent.futures
import json
import sys

import gin
import pytest

from agentic_jax.agents import (
    Budget,
    ReActAgent,
    ScriptedPolicy,
    Tracer,
    compare_events,
    load,
    render,
)
from agentic_jax.agents.context.golden import Trajectory, compare
from agentic_jax.agents.session import read_tasks
from agentic_jax.agents.tools.base import tool
from agentic_jax.agents.tools.builtin import calculator
from agentic_jax.cli import main


@tool
def search(query: str) -> str:
    """Searches the web."""
    return f"results for {query}"


def run_agent(script, path=None, **kwargs):
    tracer = Tracer(path, otel=False)
    return ReActAgent(ScriptedPolicy(script), [calculator, search], tracer=tracer, **kwargs).run(
        "task"
    ), tracer


def calls(*names):
    args = {"calculator": {"expression": "1 + 1"}, "search": {"query": "q"}}
    return [{"tool_calls": [{"name": n, "arguments": args[n]}]} for n in names]


@pytest.fixture(autouse=True)
def clean_gin():
    """CLI runs bind gin parameters; later tests in this process must not see them."""
    yield
    gin.clear_config()


def test_events_are_jsonl_with_tokens_latency_and_cost(tmp_path):
    path = tmp_path / "trace.jsonl"
    result, tracer = run_agent(calls("search", "calculator") + ["2"], path)
    events = load(path)
    assert events == json.loads(json.dumps(tracer.events)) and len({e["run"] for e in events}) == 1
    assert [e["kind"] for e in events] == [
        "run_start",
        "model_call",
        "tool_call",
        "model_call",
        "tool_call",
        "model_call",
        "decision",
        "run_end",
    ]
    model = events[1]
    assert model["prompt_tokens"] > 0 and model["latency_s"] >= 0 and model["cost"] == 0.0
    assert model["tool_calls"] == [{"name": "search", "arguments": {"query": "q"}}]
    assert events[2]["data"] is True and events[2]["content"] == "results for q"
    end = events[-1]
    assert end["stop_reason"] == "answer" and end["total_tokens"] == result.usage.total_tokens
    text = render(events)
    assert "-> search" in text and "tool   calculator ok" in text and "stop: answer" in text


@pytest.fixture
def frequent_thread_switches():
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # races show up at once
    yield
    sys.setswitchinterval(interval)


def test_scoped_views_in_threads_number_events_uniquely_in_file_order(
    tmp_path, frequent_thread_switches
):
    tracer = Tracer(tmp_path / "trace.jsonl", otel=False)
    views = [tracer.scoped(agent=f"a{i}") for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(len(views)) as pool:  # as graph.parallel runs
        list(pool.map(lambda view: [view.emit("decision", step=k) for k in range(200)], views))
    assert [e["seq"] for e in tracer.events] == list(range(800))
    assert [e["seq"] for e in load(tmp_path / "trace.jsonl")] == list(range(800))


def otel_tracer():
    """A Tracer exporting to memory, and the exporter."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer()
    tracer._otel = provider.get_tracer("test")
    return tracer, exporter


def test_opentelemetry_spans_when_installed():
    tracer, exporter = otel_tracer()
    ReActAgent(ScriptedPolicy(calls("search") + ["done"]), [search], tracer=tracer).run("t")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert {"agent.run", "agent.model_call", "agent.tool_call search"} <= set(spans)
    root = spans["agent.run"]
    assert spans["agent.tool_call search"].parent.span_id == root.context.span_id
    assert root.attributes["agent.stop_reason"] == "answer"


def test_opentelemetry_spans_of_views_and_nested_runs_have_their_run_as_parent():
    """A view made before ``run_start`` (a team's own log) parents its spans to the run; a run
    started inside another (a sub-agent) is a child of it, and holds its own spans."""
    tracer, exporter = otel_tracer()
    team_log = tracer.scoped(agent="debate")
    tracer.emit("run_start", task="t", agent="debate")
    team_log.decision(1, "round")
    member = tracer.scoped(agent="critic")
    member.emit("run_start", task="sub", agent="critic")
    member.decision(1, "inner")
    member.emit("run_end", stop_reason="answer")
    team_log.decision(2, "outer")
    tracer.emit("run_end", stop_reason="answer")
    spans = exporter.get_finished_spans()
    (outer,) = [s for s in spans if s.name == "agent.run" and s.parent is None]
    (inner,) = [s for s in spans if s.name == "agent.run" and s.parent is not None]
    by_name = {s.name: s for s in spans}
    assert inner.parent.span_id == outer.context.span_id
    assert by_name["agent.decision round"].parent.span_id == outer.context.span_id
    assert by_name["agent.decision inner"].parent.span_id == inner.context.span_id
    assert by_name["agent.decision outer"].parent.span_id == outer.context.span_id


def test_golden_trajectory_catches_a_change_in_tool_order():
    golden, _ = run_agent(calls("search", "calculator") + ["2"])
    same, _ = run_agent(calls("search", "calculator") + ["2"])
    swapped, _ = run_agent(calls("calculator", "search") + ["2"])
    assert compare_events(golden.trace, same.trace).passed
    result = compare_events(golden.trace, swapped.trace)
    assert not result.passed and result.similarity < 0.9
    assert any("tool order changed" in p for p in result.problems)
    assert "FAIL" in result.report()


def test_a_trace_file_of_several_runs_compares_one_run(tmp_path):
    path = tmp_path / "session.jsonl"  # a session appends one run per task
    first, first_tracer = run_agent(calls("search") + ["1"], path)
    last, _ = run_agent(calls("calculator", "calculator") + ["2"], path)
    events = load(path)
    assert Trajectory.from_events(events) == Trajectory.from_events(last.trace)
    assert Trajectory.from_events(events, run=first_tracer.run_id) == Trajectory.from_events(
        first.trace
    )
    assert compare_events(events, last.trace).passed
    with pytest.raises(ValueError, match="no run 'nope'"):
        Trajectory.from_events(events, run="nope")


def test_trace_cli_names_a_run_of_a_session_file(tmp_path, capsys):
    """Of a file holding several runs, ``show --run`` renders one and ``compare`` takes any run
    of either file; an unknown run id or a missing file is an error that names it."""
    path = tmp_path / "session.jsonl"
    _, first = run_agent(calls("search") + ["1"], path)
    _, second = run_agent(calls("calculator", "calculator") + ["2"], path)
    golden = tmp_path / "golden.jsonl"
    run_agent(calls("search") + ["1"], golden)
    assert main(["trace", "show", str(path), "--run", first.run_id]) == 0
    out = capsys.readouterr().out
    assert f"run {first.run_id}" in out and f"run {second.run_id}" not in out
    assert "tool   search ok" in out and "calculator" not in out
    assert main(["trace", "compare", str(golden), str(path)]) == 1  # the last run differs
    assert "FAIL" in capsys.readouterr().out
    assert main(["trace", "compare", str(golden), str(path), "--new_run", first.run_id]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["trace", "compare", str(path), str(golden), "--golden_run", second.run_id]) == 1
    capsys.readouterr()
    assert main(["trace", "show", str(path), "--run", "nope"]) == 2
    assert "no run 'nope'" in capsys.readouterr().err
    assert main(["trace", "compare", str(tmp_path / "missing.jsonl"), str(path)]) == 2
    assert "missing.jsonl" in capsys.readouterr().err


def test_compare_with_arguments_tells_calls_apart():
    golden, _ = run_agent([{"tool_calls": [{"name": "search", "arguments": {"query": "a"}}]}, "1"])
    other, _ = run_agent([{"tool_calls": [{"name": "search", "arguments": {"query": "b"}}]}, "1"])
    assert compare_events(golden.trace, other.trace).passed
    assert not compare_events(golden.trace, other.trace, with_arguments=True).passed


def test_golden_trajectory_token_overhead_and_stop_reason():
    golden = Trajectory(("a", "b"), 1000, "x", "answer")
    assert compare(golden, Trajectory(("a", "b"), 1100, "x", "answer")).passed
    slow = compare(golden, Trajectory(("a", "b"), 1500, "x", "answer"))
    assert not slow.passed and slow.token_overhead == pytest.approx(0.5)
    assert not compare(golden, Trajectory(("a", "b"), 900, None, "max_steps")).passed
    free = Trajectory(("a",), 0, "x", "answer")  # e.g. a server that reported no usage
    costly = Trajectory(("a",), 10**6, "x", "answer")
    assert compare(free, free).passed and not compare(free, costly).passed


def test_agent_cli_runs_the_scripted_config_and_trace_verbs_render_it(tmp_path, capsys):
    trace = tmp_path / "run.jsonl"
    assert (
        main(
            [
                "agent",
                "--gin_file",
                "agent_calculator_scripted",
                "--task",
                "What is 17 * 23 + 100?",
                "--trace",
                str(trace),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "task: What is 17 * 23 + 100?" in out and "error: invalid arguments" in out
    assert "tool   calculator ok, " in out and "answer: 17 * 23 + 100 = 491." in out
    assert main(["trace", "show", str(trace)]) == 0
    assert capsys.readouterr().out.strip() == out.strip()
    assert main(["trace", "compare", str(trace), str(trace)]) == 0
    assert "PASS" in capsys.readouterr().out
    assert (
        main(
            [
                "agent",
                "--gin_file",
                "agent_calculator_scripted",
                "--gin_param",
                "agents.Budget.max_steps=2",
            ]
        )
        == 1
    )  # the config's own task
    assert "stop: max_steps" in capsys.readouterr().out


def test_agent_cli_reads_tasks_interactively(monkeypatch, capsys):
    typed = iter(["What is 17 * 23 + 100?", ""])
    monkeypatch.setattr("builtins.input", lambda prompt="": next(typed))
    assert (
        main(
            [
                "agent",
                "--gin_file",
                "agent_calculator_scripted",
                "--gin_param",
                "agents.AgentConfig.task=None",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.count("task: ") == 1


def test_agent_cli_task_file_and_missing_policy(tmp_path, capsys):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task": "first"}\n\n{"task": "second"}\n')
    # One policy serves every task of a session, so the script needs a turn per task.
    assert (
        main(
            [
                "agent",
                "--gin_file",
                "agent_calculator_scripted",
                "--task_file",
                str(tasks),
                "--gin_param",
                "agents.ScriptedPolicy.responses=['ok', 'ok']",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "task: first" in out and "task: second" in out and out.count("answer: ok") == 2
    with pytest.raises(ValueError, match="no policy"):
        main(["agent", "--gin_param", "agents.AgentConfig.task='x'"])
    for bad, problem in [
        ('{"task": "cut off', "2: not a JSON object"),
        ('{"prompt": "x"}', "2: a JSON task line needs a string 'task'"),
    ]:
        tasks.write_text(f'{{"task": "first"}}\n{bad}\n')
        with pytest.raises(ValueError, match=f"tasks.jsonl:{problem}"):
            read_tasks(tasks)
    assert Budget().max_steps == 10  # each run parses its config afresh
