"""State graphs: typed state, conditional edges, checkpoints, human in the loop, workflows."""

import threading

import pydantic
import pytest

from agentic_jax.agents import (
    END,
    FileCheckpointer,
    GraphError,
    ScriptedPolicy,
    StateGraph,
    parallel,
)
from agentic_jax.agents.loops.graph import Checkpoint
from agentic_jax.agents.loops.workflows import (
    evaluator_optimizer,
    orchestrator_workers,
    parallelization,
    prompt_chain,
    routing,
)
from agentic_jax.agents.policies.base import AssistantMessage


class Counter(pydantic.BaseModel):
    n: int = 0
    log: list[str] = []


def counting_graph():
    return (
        StateGraph(Counter)
        .add_node("inc", lambda s: {"n": s.n + 1, "log": s.log + ["inc"]})
        .add_node("report", lambda s: {"log": s.log + [f"n={s.n}"]})
        .add_conditional_edges(
            "inc", lambda s: "small" if s.n < 3 else "big", {"small": "inc", "big": "report"}
        )
    )


def test_conditional_edges_loop_until_the_router_exits():
    run = counting_graph().compile().invoke({"n": 0})
    assert run.status == "done" and run.state.n == 3
    assert run.path == ("inc", "inc", "inc", "report") and run.state.log[-1] == "n=3"


def test_state_is_typed_and_checkpointed_after_every_node(tmp_path):
    graph = counting_graph().compile(checkpointer=FileCheckpointer(tmp_path))
    graph.invoke({"n": 1}, thread_id="t1")
    reread = FileCheckpointer(tmp_path).latest("t1")  # survives the process
    assert reread.status == "done" and reread.state["n"] == 3 and reread.step == 3
    history = graph.checkpointer.history["t1"]
    assert [c.node for c in history] == ["inc", "inc", "report"]
    assert [c.state["n"] for c in history] == [2, 3, 3]
    bad = StateGraph(Counter).add_node("oops", lambda s: {"n": "many"}).compile()
    with pytest.raises(pydantic.ValidationError):
        bad.invoke({})


def test_any_thread_id_gets_its_own_file_inside_the_directory(tmp_path):
    ids = ["a/b", "a%2Fb", "../x", "..", ".", "", "a\\b", "x y:z"]
    directory = tmp_path / "checkpoints"
    writer = FileCheckpointer(directory)
    for step, thread_id in enumerate(ids):
        writer.put(Checkpoint(thread_id, step, None, END, "done", {}))
    reader = FileCheckpointer(directory)  # a fresh process
    assert [reader.latest(t).step for t in ids] == list(range(len(ids)))
    assert all(p.parent == directory for p in tmp_path.rglob("*") if p.is_file())


def test_human_in_the_loop_interrupt_edit_approve_and_reject():
    sent = []
    graph = (
        StateGraph(Counter)
        .add_node("draft", lambda s: {"n": 100})
        .add_node("send", lambda s: sent.append(s.n) or {"log": ["sent"]})
        .add_edge("draft", "send")
        .compile(interrupt_before=["send"])
    )
    run = graph.invoke({}, thread_id="a")
    assert run.status == "interrupted" and run.next == "send" and sent == []
    assert graph.get_state("a").status == "interrupted"
    run = graph.resume("a", edit={"n": 42})
    assert run.status == "done" and sent == [42] and run.state.log == ["sent"]
    graph.invoke({}, thread_id="b")
    run = graph.resume("b", approve=False)
    assert run.status == "rejected" and sent == [42]
    with pytest.raises(GraphError, match="not interrupted"):
        graph.resume("b")


def test_graph_errors():
    with pytest.raises(GraphError, match="unknown node"):
        StateGraph(Counter).add_node("a", lambda s: None).add_edge("a", "b").compile()
    with pytest.raises(GraphError, match="no nodes"):
        prompt_chain(ScriptedPolicy([]), [])
    forever = StateGraph(Counter).add_node("a", lambda s: None).add_edge("a", "a")
    with pytest.raises(GraphError, match="max_steps"):
        forever.compile(max_steps=5).invoke({})


def test_parallel_nodes_run_concurrently():
    barrier = threading.Barrier(2, timeout=5)  # passes only if both branches run at once

    def branch(key):
        return lambda s: barrier.wait() is not None and {key: s.n + 1}

    class Pair(pydantic.BaseModel):
        n: int = 1
        a: int = 0
        b: int = 0

    node = parallel({"a": branch("a"), "b": branch("b")})
    run = StateGraph(Pair).add_node("both", node).compile().invoke({})
    assert (run.state.a, run.state.b) == (2, 2)


def test_a_file_checkpoint_resumes_sets_and_tuples_exactly(tmp_path):
    class Tagged(pydantic.BaseModel):
        tags: set[str] = set()
        pair: tuple[int, int] = (0, 0)

    def compiled():  # a fresh process: new graph, new checkpointer on the same directory
        return (
            StateGraph(Tagged)
            .add_node("tag", lambda s: {"tags": {"x", "y"}, "pair": (1, 2)})
            .add_node("check", lambda s: None)
            .add_edge("tag", "check")
            .compile(checkpointer=FileCheckpointer(tmp_path), interrupt_before=["check"])
        )

    assert compiled().invoke({}, thread_id="t").status == "interrupted"
    run = compiled().resume("t")
    assert run.status == "done" and run.state == Tagged(tags={"x", "y"}, pair=(1, 2))


def test_bad_updates_and_routes_are_graph_errors_naming_the_node():
    class Out(pydantic.BaseModel):
        output: str = ""

    with pytest.raises(GraphError, match=r"node 'a' updated unknown field\(s\) \['ouput'\]"):
        StateGraph(Out).add_node("a", lambda s: {"ouput": "x"}).compile().invoke({})
    with pytest.raises(GraphError, match="node 'a' returned a str"):
        StateGraph(Out).add_node("a", lambda s: "x").compile().invoke({})
    routed = StateGraph(Out).add_node("a", lambda s: None)
    with pytest.raises(GraphError, match="router of 'a' chose 'zz'"):
        routed.add_conditional_edges("a", lambda s: "zz", {"done": END}).compile().invoke({})
    with pytest.raises(GraphError, match="unknown node 'b'"):
        routed.add_conditional_edges("a", lambda s: "x", {"x": "b"}).compile()
    paused = routed.add_node("b", lambda s: None).add_edge("a", "b").compile(interrupt_before=["b"])
    paused.invoke({})
    with pytest.raises(GraphError, match=r"edit updated unknown field\(s\) \['nope'\]"):
        paused.resume(edit={"nope": 1})


def test_parallel_branches_may_not_overwrite_each_other_and_errors_name_the_branch():
    both = parallel({"a": lambda s: {"n": 1}, "b": lambda s: {"n": 2}})
    with pytest.raises(GraphError, match="branches 'a' and 'b' both update 'n'"):
        StateGraph(Counter).add_node("both", both).compile().invoke({})

    def fail(state):
        raise ZeroDivisionError("boom")

    with pytest.raises(ZeroDivisionError) as error:
        parallel({"ok": lambda s: None, "bad": fail})(Counter())
    assert "raised by parallel branch 'bad'" in error.value.__notes__
    with pytest.raises(GraphError, match="at least one branch"):
        parallel({})


class KeywordPolicy:
    """Answers by the first keyword of its instruction found in a table (order-free, so it
    works for concurrent calls)."""

    def __init__(self, table):
        self.table, self.calls = table, []

    def respond(self, messages, tools=(), **sampling):
        self.calls.append([m.content for m in messages])
        system, user = messages[0].content, messages[-1].content
        for key, reply in self.table.items():
            if key in system:
                return AssistantMessage(reply(user) if callable(reply) else reply)
        raise AssertionError(f"no reply for {system!r}")


def test_prompt_chaining_with_a_gate():
    policy = ScriptedPolicy(["outline", "draft", "final"])
    run = prompt_chain(policy, ["Outline:", "Draft:", "Polish:"]).invoke({"input": "topic"})
    assert run.state.output == "final" and run.state.outputs == ["outline", "draft", "final"]
    assert policy.calls[1][0][1].content == "outline"
    gated = prompt_chain(
        ScriptedPolicy(["bad", "never"]), ["a", "b"], gate=lambda i, out: out != "bad"
    ).invoke({"input": "x"})
    assert gated.state.stopped_by_gate and gated.path == ("step_0",)


def test_routing_parallelization_orchestrator_and_evaluator_optimizer():
    policy = KeywordPolicy({"Classify": "billing", "refund": "Refunded.", "tech": "Rebooted."})
    run = routing(policy, {"tech": "You fix tech issues.", "billing": "You refund money."}).invoke(
        {"input": "I was charged twice"}
    )
    assert run.state.route == "billing" and run.state.output == "Refunded."

    for reply, route in [
        ("code_review", "code_review"),
        ("Category: poetry, not aftermath.", "poetry"),
        ("none fits", "code"),
    ]:
        run = routing(
            KeywordPolicy({"Classify": reply, "You": "ok"}),
            {n: f"You do {n}." for n in ("code", "math", "code_review", "poetry")},
        ).invoke({"input": "x"})
        assert run.state.route == route  # whole words only; the first route when none

    votes = KeywordPolicy({"judge A": "yes", "judge B": "no", "judge C": "yes"})
    majority = lambda r: max(set(r.values()), key=list(r.values()).count)  # noqa: E731
    run = parallelization(votes, {k: f"You are judge {k}." for k in "ABC"}, majority).invoke(
        {"input": "is it safe?"}
    )
    assert run.state.results == {"A": "yes", "B": "no", "C": "yes"} and run.state.output == "yes"

    workers = KeywordPolicy(
        {
            "Split": "1. north\n2. south",
            "Solve": lambda u: u.split()[-1].upper(),
            "Combine": lambda u: u.count("- ") * "x",
        }
    )
    run = orchestrator_workers(workers).invoke({"input": "survey"})
    assert run.state.subtasks == ["north", "south"] and run.state.results == ["NORTH", "SOUTH"]
    assert run.state.output == "xx"

    drafts = iter(["draft 1", "draft 2"])
    optimizer = KeywordPolicy(
        {
            "Write": lambda u: next(drafts),
            "Evaluate": lambda u: "ACCEPT" if "draft 2" in u else "more detail",
        }
    )
    run = evaluator_optimizer(optimizer).invoke({"input": "write"})
    assert run.state.accepted and run.state.output == "draft 2" and run.state.rounds == 2
    assert "Feedback: more detail" in optimizer.calls[2][1]


@pytest.mark.parametrize(
    "verdict,accepted",
    [
        ("ACCEPT", True),
        ("**ACCEPT**", True),
        ("__Accept__ - clear", True),
        ("ACCEPT.", True),
        ("ACCEPTABLE? No, add a source.", False),
        ("Not ACCEPT yet", False),
    ],
)
def test_the_evaluator_accepts_only_the_word_accept_first(verdict, accepted):
    policy = KeywordPolicy({"Write": "draft", "Evaluate": verdict})
    run = evaluator_optimizer(policy, max_rounds=1).invoke({"input": "write"})
    assert run.state.accepted is accepted
