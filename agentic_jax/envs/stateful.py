"""Tasks graded by the state they end in (tau-bench: Yao et al. 2024, arXiv:2406.12045).

A verifier that reads the final answer cannot grade an agent that changes the world (cancels
an order, moves money): what counts is what it changed.  Here a task's world is an in-memory
SQLite database (stdlib ``sqlite3``), opened fresh for each episode (`StatefulTask.start`).
Tools read and change its tables; the task's golden actions applied to its initial state give
the goal state; `GoalState` compares the episode's final state with it.  States compare by
`canonical_hash` (each table's columns by name, rows sorted), so the grade ignores the order in
which the agent did things and rows were stored, and catches any wrong or extra change
whatever the agent says.  Where the task asks for information, the required outputs must also
appear in what the agent told the user, as tau-bench checks them.

The request comes from a simulated user holding the task's `Instruction` (``envs.users``).
Host only: a database is per episode, which a jitted bank cannot hold; the tasks play through
the agent harness (``eval.suites``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sqlite3
from collections.abc import Sequence

import jsonschema

from agentic_jax.data.chat import ToolCall, ToolSpec
from agentic_jax.envs.text.rewards import Reward
from agentic_jax.envs.text.tasks import Task
from agentic_jax.envs.users import Instruction

Rows = tuple[tuple[str, tuple[tuple, ...]], ...]  # (table, its rows), as the schema orders columns


def canonical_hash(connection: sqlite3.Connection) -> str:
    """16 hex digits of the sha256 of every table: its name, columns by name and rows sorted by
    their JSON, so that neither insertion order nor rowids change it."""
    names = connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
    ).fetchall()
    tables = []
    for (name,) in names:
        cursor = connection.execute(f'SELECT * FROM "{name}"')
        columns = [d[0] for d in cursor.description]
        order = sorted(range(len(columns)), key=columns.__getitem__)
        rows = sorted(json.dumps([row[i] for i in order]) for row in cursor)
        tables.append([name, sorted(columns), rows])
    return hashlib.sha256(json.dumps(tables).encode()).hexdigest()[:16]


class Database:
    """One episode's world: an in-memory database with ``schema`` and ``rows``; ``task`` is the
    task it plays (what `GoalState` grades against)."""

    def __init__(self, schema: str, rows: Rows, task: StatefulTask | None = None):
        self.task = task
        # Autocommit; the harness runs each tool call on a worker thread.
        self.connection = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.connection.row_factory = sqlite3.Row
        self.connection.executescript(schema)
        for table, table_rows in rows:
            for row in table_rows:
                marks = ", ".join("?" * len(row))
                self.connection.execute(f'INSERT INTO "{table}" VALUES ({marks})', row)

    def query(self, sql: str, *parameters) -> list[sqlite3.Row]:
        return self.connection.execute(sql, parameters).fetchall()

    def execute(self, sql: str, *parameters) -> None:
        self.connection.execute(sql, parameters)

    def state_hash(self) -> str:
        return canonical_hash(self.connection)


class DatabaseTool:
    """A tool over an episode's `Database`; a subclass sets ``name``, ``description`` and the
    JSON schema ``parameters``, and implements ``apply``, returning the tool message (an
    ``error: ...`` text for a refused request, so the agent can recover).  It has the members
    the harness adapter (``eval.suites.episodes.TaskTool``) reads from an environment tool."""

    name: str
    description: str
    parameters: dict

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def host_argument(self, arguments: dict) -> dict | None:
        """The arguments if they fit the schema, else None (the harness tells the model so)."""
        try:
            jsonschema.validate(arguments, self.parameters)
        except jsonschema.ValidationError:
            return None
        return dict(arguments)

    def run_host(self, argument: dict, world: Database) -> str:
        return self.apply(world, **argument)

    def apply(self, db: Database, **arguments) -> str:
        raise NotImplementedError


def apply_calls(
    db: Database, tools: Sequence[DatabaseTool], calls: Sequence[ToolCall]
) -> list[str]:
    """Runs golden ``calls`` on ``db`` and returns their results; a golden action must
    succeed, so a refusal raises."""
    named, results = {t.name: t for t in tools}, []
    for call in calls:
        tool = named[call.name]
        results.append(tool.run_host(tool.host_argument(call.arguments), db))
        if results[-1].startswith("error"):
            raise ValueError(
                f"the golden action {call.name} {call.arguments} failed: {results[-1]}"
            )
    return results


@dataclasses.dataclass(frozen=True)
class StatefulTask(Task):
    """A `Task` whose world is a database: ``schema`` and initial ``rows``, the ``golden``
    actions, the goal state they lead to (``goal_hash``; ``initial_hash`` is the start's), the
    ``outputs`` the agent must tell the user, and the simulated user's ``instruction``."""

    schema: str = ""
    rows: Rows = ()
    golden: tuple[ToolCall, ...] = ()
    outputs: tuple[str, ...] = ()
    instruction: Instruction = Instruction(())
    initial_hash: str = ""
    goal_hash: str = ""

    def start(self) -> Database:
        """A fresh database at the initial state, for one episode."""
        return Database(self.schema, self.rows, task=self)


def _said(output: str, content: str) -> bool:
    """tau-bench's output check: case-insensitive, commas ignored."""
    return output.lower() in content.lower().replace(",", "")


class GoalState(Reward):
    """1 when the episode's database (the second argument of ``host``) ends in its task's goal
    state and every required output appears in ``content`` (what the agent told the user),
    else 0.  Host only."""

    def __call__(self, content, task):
        raise TypeError("GoalState reads an episode's database: it scores on the host only")

    def host(self, content: str, world: Database) -> float:
        task = world.task
        reached = world.state_hash() == task.goal_hash
        return float(reached and all(_said(o, content) for o in task.outputs))
