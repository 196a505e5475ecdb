"""Tracing (JSONL events, OpenTelemetry spans by the GenAI semantic conventions),
golden-trajectory regression, and the agent/trace CLI verbs on a scripted policy."""

import concurrent.futures
import json
import sys

import gin
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE

from agentic_jax import config as gin_config
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
from agentic_jax.agents.multi_agent import Debate, TeamMember
from agentic_jax.agents.session import (
    AgentConfig,
    make_agent,
    make_policy,
    model_name,
    read_tasks,
)
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


def otel_tracer(**kwargs):
    """A Tracer exporting to memory, and the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = Tracer(**kwargs)
    tracer._otel = provider.get_tracer("test")
    return tracer, exporter


# The names the GenAI semantic conventions define, in the installed conventions package.
GEN_AI_NAMES = {v for k, v in vars(gen_ai).items() if k.startswith("GEN_AI_")}
OPERATIONS = {v.value for v in gen_ai.GenAiOperationNameValues}


def assert_conventional(spans):
    """Every ``gen_ai.*`` attribute, and each operation, is one the conventions define."""
    for span in spans:
        names = {k for k in span.attributes if k.startswith("gen_ai.")}
        assert names <= GEN_AI_NAMES, (span.name, names - GEN_AI_NAMES)
        if names:
            assert span.attributes[gen_ai.GEN_AI_OPERATION_NAME] in OPERATIONS


def nanoseconds(seconds):
    return int(seconds * 1e9)


KINDS = ("run_start", "model_call", "tool_call", "run_end")


def test_a_scripted_run_is_genai_spans_timed_by_its_events():
    """The shipped scripted config: the run is an ``invoke_agent`` span holding a ``chat`` span
    per model call and an ``execute_tool`` span per tool call (the first with invalid arguments),
    each from its event's start to its end; the JSONL events are those of an untraced run."""
    gin_config.parse(["agent_calculator_scripted"], [])
    config = AgentConfig()
    tracer, exporter = otel_tracer(model="scripted-model")
    result = make_agent(config, make_policy(config), tracer=tracer).run(config.task)
    assert result.ok
    untraced = make_agent(config, make_policy(AgentConfig()), tracer=Tracer(otel=False))
    moments = ("run", "time", "latency_s", "wall_s")
    assert [{k: v for k, v in e.items() if k not in moments} for e in result.trace] == [
        {k: v for k, v in e.items() if k not in moments} for e in untraced.run(config.task).trace
    ]
    spans = exporter.get_finished_spans()
    assert_conventional(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent react"
    assert root.attributes[gen_ai.GEN_AI_OPERATION_NAME] == "invoke_agent"
    assert root.attributes[gen_ai.GEN_AI_AGENT_NAME] == "react"
    assert root.attributes[gen_ai.GEN_AI_AGENT_ID] == tracer.run_id
    assert root.attributes[gen_ai.GEN_AI_CONVERSATION_ID] == tracer.run_id
    assert root.attributes["agent.stop_reason"] == "answer"
    events = {kind: [e for e in result.trace if e["kind"] == kind] for kind in KINDS}
    assert root.start_time == nanoseconds(events["run_start"][0]["time"])
    assert root.end_time == nanoseconds(events["run_end"][0]["time"])
    chats = [s for s in spans if s.name.startswith("chat")]
    tools = [s for s in spans if s.name.startswith("execute_tool")]
    assert len(chats) == len(events["model_call"]) == 4
    assert len(tools) == len(events["tool_call"]) == 3
    for span, event in [*zip(chats, events["model_call"]), *zip(tools, events["tool_call"])]:
        assert span.parent.span_id == root.context.span_id
        assert span.end_time == nanoseconds(event["time"])
        assert span.end_time - span.start_time == nanoseconds(event["latency_s"]) > 0
    for span, event in zip(chats, events["model_call"]):
        assert span.name == "chat scripted-model"
        expected = {
            gen_ai.GEN_AI_OPERATION_NAME: "chat",
            gen_ai.GEN_AI_REQUEST_MODEL: "scripted-model",
            gen_ai.GEN_AI_USAGE_INPUT_TOKENS: event["prompt_tokens"],
            gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: event["completion_tokens"],
            gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: (event["finish_reason"],),
        }
        assert expected.items() <= span.attributes.items() and event["prompt_tokens"] > 0
    assert [s.attributes.get(ERROR_TYPE) for s in tools] == ["invalid_arguments", None, None]
    assert [e["status"] for e in events["tool_call"]] == ["invalid_arguments", "ok", "ok"]
    for span in tools:
        assert span.name == "execute_tool calculator"
        expected = {
            gen_ai.GEN_AI_OPERATION_NAME: "execute_tool",
            gen_ai.GEN_AI_TOOL_NAME: "calculator",
            gen_ai.GEN_AI_TOOL_TYPE: "function",
        }
        assert expected.items() <= span.attributes.items()
    assert len({s.attributes[gen_ai.GEN_AI_TOOL_CALL_ID] for s in tools}) == 3


def test_a_teams_spans_name_the_agent_that_made_each_call():
    """A debate is one ``invoke_agent debate`` span; its members' model and tool calls are its
    children and name their member.  A tracer told no model names its chat spans ``chat``."""
    tracer, exporter = otel_tracer()
    members = [
        TeamMember("a", ScriptedPolicy(calls("search") + ["ANSWER: 4"]), tools=[search]),
        TeamMember("b", ScriptedPolicy(["ANSWER: 4"])),
    ]
    assert Debate(members).run("2 + 2?", tracer=tracer).answer == "4"
    spans = exporter.get_finished_spans()
    assert_conventional(spans)
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "invoke_agent debate"
    assert root.attributes[gen_ai.GEN_AI_AGENT_NAME] == "debate"
    calls_by_agent = [
        (s.name, s.attributes[gen_ai.GEN_AI_AGENT_NAME])
        for s in spans
        if s.name.startswith(("chat", "execute_tool"))
    ]
    assert calls_by_agent == [
        ("chat", "a"),
        ("execute_tool search", "a"),
        ("chat", "a"),
        ("chat", "b"),
    ]
    assert all(
        s.parent.span_id == root.context.span_id and gen_ai.GEN_AI_REQUEST_MODEL not in s.attributes
        for s in spans
        if s is not root
    )


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
    (outer,) = [s for s in spans if s.name == "invoke_agent debate"]
    (inner,) = [s for s in spans if s.name == "invoke_agent critic"]
    by_name = {s.name: s for s in spans}
    assert outer.parent is None and inner.parent.span_id == outer.context.span_id
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


def test_model_name_is_the_endpoints_model_or_the_checkpoint_the_policy_came_from():
    """What ``agentic-jax agent`` and the UI call the model in their ``chat`` spans."""

    class Endpoint:
        model = "served-model"

    config = AgentConfig(checkpoint="runs/x/rl")
    assert model_name(config, Endpoint(), None) == "served-model"
    assert model_name(config, object(), None) == "runs/x/rl"
    assert model_name(config, object(), "runs/y/sft") == "runs/y/sft"
    scripted = AgentConfig(policy=object(), checkpoint="runs/x/rl")  # the policy wins over it
    assert model_name(scripted, object(), None) is None
