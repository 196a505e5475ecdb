"""A small state-graph runner for agent workflows, in the style of LangGraph.

A workflow is a graph whose nodes are functions of a typed state (a pydantic model) returning an
update (a dict of fields, or ``None``); edges are fixed or *conditional* (a router function of the
state names the next node).  After every node the state is checkpointed, so a run can be inspected,
resumed after a crash, or paused for a human:

* ``interrupt_before=[node]`` pauses before ``node`` runs; the run's status is ``interrupted``;
* :meth:`CompiledGraph.resume` continues it, optionally after ``edit``-ing the state, or ends it
  (``approve=False``: status ``rejected``).

Nodes made with :func:`parallel` run branches concurrently and merge their updates, which with
conditional edges and cycles covers the workflow patterns of Anthropic's *Building effective
agents*: prompt chaining, routing, parallelisation, orchestrator-workers and evaluator-optimizer
(see ``workflows.py``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import pydantic
import pydantic_core

END = "__end__"
S = TypeVar("S", bound=pydantic.BaseModel)
Node = Callable[[Any], Mapping[str, Any] | None]
Router = Callable[[Any], str]


class GraphError(RuntimeError):
    pass


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    """The state after ``node`` ran (or before ``next`` runs); ``status``: running, interrupted,
    done or rejected."""

    thread_id: str
    step: int
    node: str | None
    next: str
    status: str
    state: dict

    def to_json(self) -> str:
        """Sets, tuples, datetimes and the like as pydantic writes them in JSON, so that the
        state validates again when read back (``str`` of a set would not); other objects as
        their ``str``."""
        return json.dumps(pydantic_core.to_jsonable_python(dataclasses.asdict(self), fallback=str))


class MemoryCheckpointer:
    """Keeps every checkpoint of every thread in memory."""

    def __init__(self):
        self.history: dict[str, list[Checkpoint]] = {}

    def put(self, checkpoint: Checkpoint) -> None:
        self.history.setdefault(checkpoint.thread_id, []).append(checkpoint)

    def latest(self, thread_id: str) -> Checkpoint | None:
        return (self.history.get(thread_id) or [None])[-1]


class FileCheckpointer(MemoryCheckpointer):
    """Also appends each checkpoint to ``directory/<thread_id>.jsonl``, and reads them back, so a
    run survives the process.  The thread id is percent-encoded in the file name, so that any id
    (``a/b``, ``../x``) names one file of its own inside ``directory``."""

    def __init__(self, directory: str | Path):
        super().__init__()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, thread_id: str) -> Path:
        return self.directory / f"{urllib.parse.quote(thread_id, safe='')}.jsonl"

    def put(self, checkpoint: Checkpoint) -> None:
        super().put(checkpoint)
        with self._path(checkpoint.thread_id).open("a") as f:
            f.write(checkpoint.to_json() + "\n")

    def latest(self, thread_id: str) -> Checkpoint | None:
        path = self._path(thread_id)
        if thread_id not in self.history and path.exists():
            self.history[thread_id] = [
                Checkpoint(**json.loads(line)) for line in path.read_text().splitlines() if line
            ]
        return super().latest(thread_id)


@dataclasses.dataclass(frozen=True)
class GraphRun(Generic[S]):
    state: S
    status: str  # done, interrupted or rejected
    next: str  # the node that runs on resume (END when done)
    path: tuple[str, ...]  # nodes run, in order, in this call


def parallel(
    branches: Mapping[str, Callable[[Any], Any]],
    *,
    merge: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None,
) -> Node:
    """A node running ``branches`` (name -> function of the state) concurrently; its update is
    ``merge({name: result})``, by default the union of the branches' update dicts.  Without
    ``merge``, two branches updating the same field is a :class:`GraphError`: which write wins
    would depend on the order of the branches, and one of them would be lost silently.  A failing
    branch's error (the first in ``branches`` order) is raised with a note naming the branch."""
    if not branches:
        raise GraphError("parallel needs at least one branch")

    def node(state):
        with concurrent.futures.ThreadPoolExecutor(len(branches)) as pool:
            futures = {name: pool.submit(fn, state) for name, fn in branches.items()}
            results = {}
            for name, future in futures.items():
                try:
                    results[name] = future.result()
                except Exception as e:
                    e.add_note(f"raised by parallel branch {name!r}")
                    raise
        if merge is not None:
            return merge(results)
        update, writer = {}, {}
        for name, result in results.items():
            for key, value in _update(f"parallel branch {name!r}", result).items():
                if key in writer:
                    raise GraphError(
                        f"parallel branches {writer[key]!r} and {name!r} both "
                        f"update {key!r}; pass merge= to combine their results"
                    )
                update[key], writer[key] = value, name
        return update

    return node


def _update(source: str, update: Any) -> Mapping[str, Any]:
    if update is None:
        return {}
    if not isinstance(update, Mapping):
        raise GraphError(
            f"{source} returned a {type(update).__name__}; it must return a dict of "
            f"state fields or None"
        )
    return update


class StateGraph(Generic[S]):
    """Nodes, edges and an entry point over states of type ``state_type``."""

    def __init__(self, state_type: type[S]):
        self.state_type = state_type
        self.nodes: dict[str, Node] = {}
        self.edges: dict[str, str | tuple[Router, Mapping[str, str] | None]] = {}
        self.entry: str | None = None

    def add_node(self, name: str, fn: Node) -> StateGraph[S]:
        if name in self.nodes or name == END:
            raise GraphError(f"node {name!r} already exists or is reserved")
        self.nodes[name] = fn
        self.entry = self.entry or name
        return self

    def add_edge(self, source: str, target: str) -> StateGraph[S]:
        self.edges[source] = target
        return self

    def add_conditional_edges(
        self, source: str, router: Router, mapping: Mapping[str, str] | None = None
    ) -> StateGraph[S]:
        """After ``source``, go to ``router(state)`` (looked up in ``mapping`` if given)."""
        self.edges[source] = (router, mapping)
        return self

    def set_entry(self, name: str) -> StateGraph[S]:
        self.entry = name
        return self

    def compile(
        self,
        *,
        checkpointer: MemoryCheckpointer | None = None,
        interrupt_before: Iterable[str] = (),
        max_steps: int = 100,
    ) -> CompiledGraph[S]:
        if self.entry is None:
            raise GraphError("the graph has no nodes")
        targets = [
            t
            for e in self.edges.values()
            for t in ([e] if isinstance(e, str) else (e[1] or {}).values())
        ]
        for name in [*targets, *self.edges, *interrupt_before, self.entry]:
            if name not in self.nodes and name != END:
                raise GraphError(f"unknown node {name!r}")
        return CompiledGraph(
            self, checkpointer or MemoryCheckpointer(), set(interrupt_before), max_steps
        )


class CompiledGraph(Generic[S]):
    def __init__(
        self,
        graph: StateGraph[S],
        checkpointer: MemoryCheckpointer,
        interrupt_before: set[str],
        max_steps: int,
    ):
        self.graph, self.checkpointer = graph, checkpointer
        self.interrupt_before, self.max_steps = interrupt_before, max_steps

    def _next(self, node: str, state: S) -> str:
        edge = self.graph.edges.get(node, END)
        if isinstance(edge, str):
            return edge
        router, mapping = edge
        choice = router(state)
        if mapping is not None and choice not in mapping:
            raise GraphError(
                f"router of {node!r} chose {choice!r}, which its mapping "
                f"{list(mapping)} does not name"
            )
        target = mapping[choice] if mapping is not None else choice
        if target not in self.graph.nodes and target != END:
            raise GraphError(f"router of {node!r} chose unknown node {target!r}")
        return target

    def _save(
        self, thread_id: str, step: int, node: str | None, nxt: str, status: str, state: S
    ) -> None:
        self.checkpointer.put(Checkpoint(thread_id, step, node, nxt, status, state.model_dump()))

    def _apply(self, source: str, state: S, update: Any) -> S:
        """``state`` with ``update``; a field the state type lacks is a :class:`GraphError`
        (pydantic would drop it silently, losing a misspelt field's value)."""
        update = _update(source, update)
        state_type = self.graph.state_type
        unknown = [k for k in update if k not in state_type.model_fields]
        if unknown and state_type.model_config.get("extra") != "allow":
            raise GraphError(
                f"{source} updated unknown field(s) {unknown} of "
                f"{state_type.__name__}, whose fields are "
                f"{list(state_type.model_fields)}"
            )
        return state_type.model_validate({**state.model_dump(), **update})

    def invoke(self, state: S | Mapping[str, Any], *, thread_id: str = "main") -> GraphRun[S]:
        """Runs from the entry node until the end or an interrupt."""
        state = self.graph.state_type.model_validate(
            state.model_dump() if isinstance(state, pydantic.BaseModel) else state
        )
        return self._run(thread_id, state, self.graph.entry, 0, skip_interrupt=False)

    def resume(
        self,
        thread_id: str = "main",
        *,
        approve: bool = True,
        edit: Mapping[str, Any] | None = None,
    ) -> GraphRun[S]:
        """Continues an interrupted run: ``edit`` updates the state first; ``approve=False``
        ends the run as ``rejected`` without running the pending node."""
        last = self.checkpointer.latest(thread_id)
        if last is None or last.status != "interrupted":
            raise GraphError(f"thread {thread_id!r} is not interrupted")
        state = self._apply("edit", self.graph.state_type.model_validate(last.state), edit)
        if not approve:
            self._save(thread_id, last.step, None, last.next, "rejected", state)
            return GraphRun(state, "rejected", last.next, ())
        return self._run(thread_id, state, last.next, last.step, skip_interrupt=True)

    def get_state(self, thread_id: str = "main") -> Checkpoint | None:
        return self.checkpointer.latest(thread_id)

    def _run(
        self, thread_id: str, state: S, node: str, step: int, *, skip_interrupt: bool
    ) -> GraphRun[S]:
        path = []
        while node != END:
            if node in self.interrupt_before and not skip_interrupt:
                self._save(thread_id, step, None, node, "interrupted", state)
                return GraphRun(state, "interrupted", node, tuple(path))
            skip_interrupt = False
            if step >= self.max_steps:
                raise GraphError(
                    f"more than max_steps={self.max_steps} node runs: a cycle without exit?"
                )
            state = self._apply(f"node {node!r}", state, self.graph.nodes[node](state))
            path.append(node)
            step += 1
            nxt = self._next(node, state)
            self._save(thread_id, step, node, nxt, "running" if nxt != END else "done", state)
            node = nxt
        return GraphRun(state, "done", END, tuple(path))
