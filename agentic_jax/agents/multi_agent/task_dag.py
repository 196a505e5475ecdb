"""Task DAGs: tasks with dependencies, run in parallel waves, a failure blocking its descendants.

A plan is often a partial order rather than a list: two searches can run side by side, the
report needs both.  :class:`TaskDAG` holds named tasks and the tasks each one runs after.  Its
``order`` is a topological order (Kahn 1962, *Topological sorting of large networks*, CACM
5(11); ties go to the task given first), and its waves are the longest-path levels::

    level(t) = 0                                  if t has no dependencies
    level(t) = 1 + max(level(d) for d in after(t))   otherwise

Wave k holds the tasks of level k.  Every dependency of a task sits in an earlier wave, so a
wave's tasks can run together, and the number of waves is the length (in tasks) of the longest
dependency chain: no schedule of one-step tasks finishes sooner.

:func:`run_dag` runs the waves one after another, each wave's tasks concurrently in a thread
pool.  A task **fails** when its function raises or returns ``None``; every task downstream of
it is then **blocked** (it never runs), and the tasks that do not depend on it still run.
Exceptions of the types in ``abort_on`` are not failures of one task but of the whole run (a
team-wide budget, say): they end it, raised again once the tasks running beside them have
finished (at once when the tasks run one at a time).

A dependency cycle can never run; :class:`TaskDAG` rejects it when built, naming the cycle.
"""

from __future__ import annotations

import concurrent.futures
import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import gin

DONE, FAILED, BLOCKED = "done", "failed", "blocked"


class Task(NamedTuple):
    name: str
    prompt: str
    after: tuple[str, ...]  # the tasks whose results it needs


@gin.configurable(module="multi_agent")
class TaskDAG:
    """``tasks`` maps each task's name to what it asks; ``after`` maps a name to the names of
    the tasks it runs after (tasks not in ``after`` depend on nothing).  Both read naturally as
    gin dicts.  Raises :class:`ValueError` for an unknown name or a cycle."""

    def __init__(self, tasks: Mapping[str, str], after: Mapping[str, Sequence[str]] | None = None):
        after = dict(after or {})
        if not tasks:
            raise ValueError("a TaskDAG needs at least one task")
        for name in [*tasks, *after]:
            if not isinstance(name, str) or not name:
                raise ValueError(f"task names must be non-empty strings, got {name!r}")
        for name, deps in after.items():
            if name not in tasks:
                raise ValueError(f"'after' names {name!r}, which is not a task of {list(tasks)}")
            if isinstance(deps, str):
                raise ValueError(f"after[{name!r}] must be a list of task names, got {deps!r}")
            unknown = [d for d in deps if d not in tasks]
            if unknown:
                raise ValueError(f"task {name!r} runs after unknown tasks {unknown}")
        self.tasks = {
            name: Task(name, prompt, tuple(dict.fromkeys(after.get(name, ()))))
            for name, prompt in tasks.items()
        }
        self.order = self._topological_order()
        self.levels: dict[str, int] = {}
        for name in self.order:
            deps = self.tasks[name].after
            self.levels[name] = 1 + max(self.levels[d] for d in deps) if deps else 0

    def _topological_order(self) -> tuple[str, ...]:
        """Kahn's algorithm, the earliest-given ready task first; a :class:`ValueError` naming a
        cycle when some tasks can never become ready."""
        place = {name: i for i, name in enumerate(self.tasks)}
        waiting = {name: len(task.after) for name, task in self.tasks.items()}
        dependents: dict[str, list[str]] = {name: [] for name in self.tasks}
        for task in self.tasks.values():
            for dep in task.after:
                dependents[dep].append(task.name)
        ready = [(place[n], n) for n, count in waiting.items() if count == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            _, name = heapq.heappop(ready)
            order.append(name)
            for child in dependents[name]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    heapq.heappush(ready, (place[child], child))
        if len(order) < len(self.tasks):
            cycle = self._cycle({n for n, count in waiting.items() if count > 0})
            raise ValueError(
                f"the tasks form a cycle: {' -> '.join(cycle)} (each must run before the next)"
            )
        return tuple(order)

    def _cycle(self, stuck: set[str]) -> list[str]:
        """A cycle among ``stuck`` (tasks Kahn never freed: each waits on another stuck task),
        found by walking dependencies until a task repeats; in running order from its
        earliest-given task, closed."""
        walk = [next(n for n in self.tasks if n in stuck)]
        while (dep := next(d for d in self.tasks[walk[-1]].after if d in stuck)) not in walk:
            walk.append(dep)
        loop = walk[walk.index(dep) :][::-1]
        place = list(self.tasks)
        first = min(range(len(loop)), key=lambda i: place.index(loop[i]))
        return [*loop[first:], *loop[:first], loop[first]]

    def waves(self) -> list[tuple[str, ...]]:
        """The tasks of each level, in ``order``."""
        out: list[list[str]] = [[] for _ in range(max(self.levels.values()) + 1)]
        for name in self.order:
            out[self.levels[name]].append(name)
        return [tuple(wave) for wave in out]

    def descendants(self, name: str) -> set[str]:
        """The tasks that need ``name``'s result, directly or through others."""
        if name not in self.tasks:
            raise ValueError(f"no task {name!r} in the DAG; it has {list(self.tasks)}")
        below: set[str] = set()
        for task in self.order:
            if any(d == name or d in below for d in self.tasks[task].after):
                below.add(task)
        return below


class DagRun(NamedTuple):
    status: dict[str, str]  # task -> done, failed or blocked, in topological order
    results: dict[str, Any]  # done task -> its result
    errors: dict[str, str]  # failed task -> why; blocked task -> which of its inputs did not come
    waves: tuple[tuple[str, ...], ...]  # the tasks started in each wave

    @property
    def ok(self) -> bool:
        return all(s == DONE for s in self.status.values())


Work = Callable[[Task, Mapping[str, Any]], Any]


@gin.configurable(module="multi_agent")
def run_dag(
    dag: TaskDAG,
    work: Work,
    *,
    max_workers: int | None = None,
    abort_on: tuple[type[BaseException], ...] = (),
) -> DagRun:
    """Runs ``work(task, inputs)`` for every task of ``dag``, wave by wave, the tasks of a wave
    concurrently on up to ``max_workers`` threads (default: as many as the widest wave; with 1,
    in the calling thread, in ``order``); ``inputs`` are the results of the task's
    dependencies.  See the module docstring."""
    if max_workers is not None and max_workers < 1:
        raise ValueError(f"max_workers must be at least 1, got {max_workers}")
    waves = dag.waves()
    status: dict[str, str] = {}
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    started = []

    def attempt(name: str) -> tuple[Exception | None, Any]:
        task = dag.tasks[name]
        try:
            return None, work(task, {d: results[d] for d in task.after})
        except abort_on:
            raise
        except Exception as e:
            return e, None

    workers = max_workers or max(len(w) for w in waves)
    pool = concurrent.futures.ThreadPoolExecutor(workers) if workers > 1 else None
    try:
        for wave in waves:
            runnable = []
            for name in wave:
                missing = [d for d in dag.tasks[name].after if status[d] != DONE]
                if missing:
                    status[name] = BLOCKED
                    errors[name] = f"needs {', '.join(missing)}, which did not finish"
                else:
                    runnable.append(name)
            if pool is None:
                outcomes = {name: attempt(name) for name in runnable}
            else:
                futures = {name: pool.submit(attempt, name) for name in runnable}
                concurrent.futures.wait(futures.values())
                outcomes = {name: f.result() for name, f in futures.items()}  # raises an abort
            for name, (error, result) in outcomes.items():
                if error is not None:
                    status[name], errors[name] = FAILED, f"{type(error).__name__}: {error}"
                elif result is None:
                    status[name], errors[name] = FAILED, "it returned no result"
                else:
                    status[name], results[name] = DONE, result
            started.append(tuple(runnable))
    finally:
        if pool is not None:
            pool.shutdown()
    return DagRun({n: status[n] for n in dag.order}, results, errors, tuple(started))
