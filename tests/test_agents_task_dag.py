"""Task DAGs: topological order and waves against brute-force references on random DAGs, failure
blocking exactly the descendants, concurrency within a wave, cycles rejected, and the
orchestrator following a plan."""

import itertools
import threading

import gin
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.agents import ScriptedPolicy
from agentic_jax.agents.multi_agent import (
    OrchestratorWorkers,
    TaskDAG,
    TeamMember,
    run_dag,
)


@st.composite
def dags(draw, max_tasks=8):
    """(tasks, after): edges only from a lower to a higher rank, so acyclic; names given in a
    shuffled order so that the given order is not already topological."""
    n = draw(st.integers(1, max_tasks))
    after = {
        f"t{j}": [f"t{i}" for i in range(j) if draw(st.booleans())]
        for j in range(n)  # t_i before t_j only when i < j
    }
    names = draw(st.permutations([f"t{j}" for j in range(n)]))
    return {name: f"do {name}" for name in names}, after


def longest_chain(after, name):
    """The number of edges on the longest dependency chain ending at ``name`` (every path)."""
    return max((1 + longest_chain(after, d) for d in after.get(name, ())), default=0)


def reaches(after, source, target):
    """Does ``target`` depend on ``source``, directly or not (depth-first search)."""
    return any(d == source or reaches(after, source, d) for d in after.get(target, ()))


def recording_work(fail=()):
    """A work function logging the tasks it runs, in order; tasks in ``fail`` raise."""
    ran, lock = [], threading.Lock()

    def work(task, inputs):
        with lock:
            ran.append(task.name)
        if task.name in fail:
            raise RuntimeError(f"{task.name} broke")
        return f"{task.name}({','.join(sorted(inputs))})"

    return work, ran


@settings(max_examples=60, deadline=None)
@given(dags())
def test_every_task_runs_after_its_dependencies_and_gets_their_results(dag_spec):
    tasks, after = dag_spec
    dag = TaskDAG(tasks, after)
    assert sorted(dag.order) == sorted(tasks)
    work, ran = recording_work()
    run = run_dag(dag, work)
    assert run.ok and sorted(ran) == sorted(tasks)
    for order in (dag.order, ran):
        position = {name: i for i, name in enumerate(order)}
        assert all(position[d] < position[t] for t, deps in after.items() for d in deps)
    for name in tasks:
        assert run.results[name] == f"{name}({','.join(sorted(after.get(name, ())))})"


@settings(max_examples=60, deadline=None)
@given(dags())
def test_waves_are_the_longest_path_levels(dag_spec):
    tasks, after = dag_spec
    dag = TaskDAG(tasks, after)
    expected = {name: longest_chain(after, name) for name in tasks}
    assert dag.levels == expected
    waves = dag.waves()
    assert len(waves) == max(expected.values()) + 1
    assert all(expected[name] == k for k, wave in enumerate(waves) for name in wave)
    assert run_dag(dag, recording_work()[0]).waves == tuple(waves)


@settings(max_examples=60, deadline=None)
@given(dags(), st.data())
def test_a_failure_blocks_exactly_its_descendants_and_the_rest_still_run(dag_spec, data):
    tasks, after = dag_spec
    fail = set(data.draw(st.lists(st.sampled_from(sorted(tasks)), max_size=3)))
    dag = TaskDAG(tasks, after)
    work, ran = recording_work(fail)
    run = run_dag(dag, work)
    blocked = {t for t in tasks if any(reaches(after, f, t) for f in fail)}
    assert {t for t, s in run.status.items() if s == "blocked"} == blocked
    assert {t for t, s in run.status.items() if s == "failed"} == fail - blocked
    assert {t for t, s in run.status.items() if s == "done"} == set(tasks) - fail - blocked
    assert set(ran) == set(tasks) - blocked  # a blocked task never runs
    assert set().union(*(dag.descendants(f) for f in fail)) == blocked
    assert all("broke" in run.errors[f] for f in fail - blocked)
    assert all("did not finish" in run.errors[b] for b in blocked)


def test_a_task_returning_nothing_fails():
    run = run_dag(TaskDAG({"a": "x", "b": "y"}, {"b": ["a"]}), lambda task, inputs: None)
    assert run.status == {"a": "failed", "b": "blocked"}
    assert run.errors["a"] == "it returned no result" and not run.ok


def test_the_tasks_of_a_wave_run_concurrently():
    """Each task of the wide wave waits until all of them have started: sequential runs would
    break the barrier (after its timeout) and fail."""
    dag = TaskDAG(
        {f"w{i}": "" for i in range(4)} | {"end": ""}, {"end": [f"w{i}" for i in range(4)]}
    )
    barrier = threading.Barrier(4, timeout=30)

    def work(task, inputs):
        if task.name != "end":
            barrier.wait()
        return task.name

    run = run_dag(dag, work)
    assert run.ok and run.waves == (("w0", "w1", "w2", "w3"), ("end",))


@pytest.mark.parametrize(("max_workers", "ran_before_stop"), [(None, ["b"]), (1, [])])
def test_an_abort_exception_ends_the_run(max_workers, ran_before_stop):
    class Stop(Exception):
        pass

    work, ran = recording_work()

    def stopping(task, inputs):
        if task.name == "a":
            raise Stop("budget")
        return work(task, inputs)

    dag = TaskDAG({"a": "", "b": "", "c": ""}, {"c": ["b"]})
    with pytest.raises(Stop):
        run_dag(dag, stopping, abort_on=(Stop,), max_workers=max_workers)
    assert ran == ran_before_stop  # b ran beside a, or never started; c never did


@pytest.mark.parametrize(
    ("after", "cycle"),
    [
        ({"a": ["a"]}, "a -> a"),
        ({"a": ["c"], "b": ["a"], "c": ["b"]}, "a -> b -> c -> a"),
        ({"b": ["a", "d"], "c": ["b"], "d": ["c"]}, "b -> c -> d -> b"),
    ],
)
def test_a_cycle_is_rejected_naming_it(after, cycle):
    with pytest.raises(ValueError, match=f"the tasks form a cycle: {cycle} "):
        TaskDAG(dict.fromkeys("abcd", ""), after)


@settings(max_examples=60, deadline=None)
@given(dags(), st.data())
def test_any_back_edge_is_rejected_with_a_real_cycle(dag_spec, data):
    tasks, after = dag_spec
    edges = [(d, t) for t, deps in after.items() for d in deps]
    (source, target) = data.draw(st.sampled_from(edges)) if edges else ("t0", "t0")
    after = {**after, source: [*after[source], target]}  # target now also runs before source
    with pytest.raises(ValueError, match="cycle") as error:
        TaskDAG(tasks, after)
    cycle = str(error.value).split(": ")[1].split(" (")[0].split(" -> ")
    assert cycle[0] == cycle[-1] and len(set(cycle)) == len(cycle) - 1
    assert all(a in after[b] for a, b in itertools.pairwise(cycle))  # each runs before the next


@pytest.mark.parametrize(
    ("tasks", "after", "message"),
    [
        ({}, None, "at least one task"),
        ({"a": ""}, {"b": ["a"]}, "'b', which is not a task"),
        ({"a": ""}, {"a": ["z"]}, r"unknown tasks \['z'\]"),
        ({"a": "", "b": ""}, {"b": "a"}, "must be a list"),
    ],
)
def test_bad_dags_are_rejected_with_the_bad_name(tasks, after, message):
    with pytest.raises(ValueError, match=message):
        TaskDAG(tasks, after)


def test_the_orchestrator_runs_a_plan_in_waves_passing_results_down():
    plan = TaskDAG({"a": "find a", "b": "find b", "c": "combine a and b"}, after={"c": ["a", "b"]})
    w1 = TeamMember("w1", ScriptedPolicy(["A", "C"]))
    w2 = TeamMember("w2", ScriptedPolicy(["B"]))
    lead = TeamMember("lead", ScriptedPolicy(["final"]))
    result = OrchestratorWorkers(lead, [w1, w2], plan=plan).run("task")
    assert result.ok and result.answer == "final"
    assert result.count("task") == result.count("result") == 3
    records = result.artifacts["lead"]
    assert [(r["subtask"], r["worker"], r["wave"]) for r in records] == [
        ("find a", "w1", 0),
        ("find b", "w2", 0),
        ("combine a and b", "w1", 1),
    ]
    combine = w1.policy.calls[-1][0][-1].content
    assert "combine a and b\n\nResults of the tasks it builds on:\n- a: A\n- b: B" in combine
    assert len(lead.policy.calls) == 1  # no decomposition: only the synthesis


def test_under_a_plan_a_task_nobody_could_do_blocks_its_dependents():
    class Broken:
        def respond(self, messages, tools=(), **sampling):
            raise RuntimeError("down")

    plan = TaskDAG({"a": "first", "b": "then"}, after={"b": ["a"]})
    lead = TeamMember("lead", ScriptedPolicy([]))
    result = OrchestratorWorkers(lead, [TeamMember("w", Broken())], plan=plan).run("task")
    assert result.stop_reason.value == "agents_failed"
    assert [(r["status"], r["worker"]) for r in result.artifacts["lead"]] == [
        ("failed", None),
        ("blocked", None),
    ]
    assert result.count("task") == 1  # the blocked task was never handed out
    assert any(e.get("decision") == "blocked" for e in result.trace)


def test_a_planned_team_is_built_from_gin():
    config = """
    multi_agent.OrchestratorWorkers.orchestrator = @lead/multi_agent.TeamMember()
    multi_agent.OrchestratorWorkers.workers = [@w/multi_agent.TeamMember()]
    multi_agent.OrchestratorWorkers.plan = @multi_agent.TaskDAG()
    multi_agent.TaskDAG.tasks = {"fetch": "fetch the data", "report": "write it up"}
    multi_agent.TaskDAG.after = {"report": ["fetch"]}
    lead/multi_agent.TeamMember.name = "lead"
    lead/multi_agent.TeamMember.policy = @lead/agents.ScriptedPolicy()
    lead/agents.ScriptedPolicy.responses = ["the report"]
    w/multi_agent.TeamMember.name = "w"
    w/multi_agent.TeamMember.policy = @w/agents.ScriptedPolicy()
    w/agents.ScriptedPolicy.responses = ["data", "report text"]
    """
    gin.clear_config()
    try:
        with gin.unlock_config():
            gin.parse_config(config)
        team = gin.get_configurable("multi_agent.OrchestratorWorkers")()
    finally:
        gin.clear_config()
    result = team.run("task")
    assert result.ok and [r["subtask"] for r in result.artifacts["lead"]] == [
        "fetch the data",
        "write it up",
    ]
