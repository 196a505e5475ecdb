"""Multi-agent memory: shared spaces with per-agent permissions and an append-only audit log.

Agents of a team share what they learn by sharing a memory space (one store file), but not every
agent should see, let alone change, everything: a planner may write the team's facts, a worker
only read them, an outside tool-using agent nothing (the least-privilege principle of Saltzer &
Schroeder 1975, *The Protection of Information in Computer Systems*; in agent teams, a
compromised or prompt-injected member must not rewrite the shared memory the others trust).

**Access list.**  Each space holds, in its own file, an access-control list: an agent name and
its level, ``read`` < ``write`` < ``admin``, each including the rights of those before it (the
viewer / editor / owner of shared documents; writing needs reading because the write policy
reads the nearest memories to detect duplicates).  ``read`` allows ``get``, ``records``,
``search`` and ``touch`` (the access time a read updates); ``write`` also ``add``, ``update``,
``invalidate`` and ``delete``; ``admin`` also ``forget_user``, ``clear`` and changing the list
(:meth:`SharedSpace.grant`, :meth:`SharedSpace.revoke`).  An agent not on the list can do
nothing.  A space is founded with its list (``acl``, which must name an admin); from then on only
an admin changes it, and a space always keeps one admin, so it cannot be locked for good.

**Agents see the store through a view.**  :meth:`SharedSpace.agent` gives an
:class:`AgentStore`: the store's reading and writing methods, each checked against the agent's
level and audited.  It has the :class:`~agentic_jax.memory.store.MemoryStore` methods the write
and read policies use, so ``MemoryWriter(space.agent("bob"), embed)`` writes as ``bob``.  The
agent's identity is the harness's to bind (the memory tools of ``agents.tools.memory`` take it
from the configuration), never an argument a model could forge.  The process that opens the
file itself is trusted: SQLite has no users, and permissions govern the agents it hosts.

**Audit log.**  Every call of a view, allowed or denied, appends a row to the ``audit`` table
of the same file: time (the store's clock), agent, action (the method), the record ids it
touched (those returned, for a read), whether it was allowed, and a detail.  An allowed call's
row commits in the same transaction as its effect, so the log never misses a committed write nor
shows one that did not happen.  A denied call raises :class:`PermissionDenied` after its row is
committed, even inside a transaction that the denial rolls back (the rows of that transaction's
reads and denials are then written on their own: they did happen; its rolled-back writes did
not).  The log is append-only: there is no method to change it, and triggers in the file abort
any ``UPDATE`` or ``DELETE`` of it, raw SQL included.  In a shared space a read is therefore a
(short) write transaction, and waits for a writer instead of reading a snapshot beside it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore

LEVELS = ("read", "write", "admin")  # each includes the rights of those before it
# The level each audited action needs; the actions of AgentStore are the store's method names.
NEEDS = {
    "get": "read",
    "records": "read",
    "search": "read",
    "touch": "read",
    "add": "write",
    "update": "write",
    "invalidate": "write",
    "delete": "write",
    "forget_user": "admin",
    "clear": "admin",
    "grant": "admin",
    "revoke": "admin",
}
OWNER = "<owner>"  # the audit log's name for the process that founded the space's list


class PermissionDenied(PermissionError):
    """An agent tried what its level does not allow; the attempt is in the audit log."""


@dataclasses.dataclass(frozen=True)
class AuditEntry:
    """One row of the audit log (see the module docstring); ``seq`` orders them."""

    seq: int
    time: float
    agent: str
    action: str
    record_ids: tuple[str, ...]
    allowed: bool
    detail: str = ""


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"an access level is one of {LEVELS}, got {level!r}")


class SharedSpace:
    """The memory space of ``store`` shared by agents under an access list (module docstring).

    ``acl`` (agent name to level) founds the space's list when it has none; a space that has one
    must be given the same list or none (an admin changes it with :meth:`grant` and
    :meth:`revoke`)."""

    def __init__(self, store: MemoryStore, acl: Mapping[str, str] | None = None):
        self.store = store
        self._local = threading.local()  # the audit rows of this thread's open transaction
        if acl:
            self._found(dict(acl))

    def _found(self, acl: dict[str, str]) -> None:
        for level in acl.values():
            _check_level(level)
        if "admin" not in acl.values():
            raise ValueError("a space's access list needs an admin (to change it later)")
        with self.transaction():
            current = self.acl()
            if current and current != acl:
                raise ValueError(
                    f"space {self.store.space!r} already has the access list {current}; an "
                    f"admin changes it with grant and revoke"
                )
            for agent, level in ({} if current else acl).items():
                self._set(agent, level)
                self._log(OWNER, "grant", (), True, f"{agent}: {level}")

    # The access list.

    def acl(self) -> dict[str, str]:
        return dict(self.store.execute("SELECT agent, level FROM acl ORDER BY agent"))

    def level(self, agent: str) -> str | None:
        """``agent``'s level, ``None`` if it is not on the list."""
        return self.acl().get(agent)

    def allows(self, agent: str, action: str) -> bool:
        level = self.level(agent)
        return level is not None and LEVELS.index(level) >= LEVELS.index(NEEDS[action])

    def _set(self, agent: str, level: str | None) -> None:
        if level is None:
            self.store.execute("DELETE FROM acl WHERE agent = ?", (agent,))
        else:
            self.store.execute("INSERT OR REPLACE INTO acl VALUES (?, ?)", (agent, level))

    def _change(self, agent: str, level: str | None, by: str, action: str) -> None:
        def change() -> None:
            acl = {**self.acl(), agent: level}
            if "admin" not in acl.values():
                raise ValueError(f"space {self.store.space!r} would be left without an admin")
            self._set(agent, level)

        self.audited(by, action, change, detail=f"{agent}: {level or 'none'}")

    def grant(self, agent: str, level: str, *, by: str) -> None:
        """Gives ``agent`` ``level`` (replacing its old one); ``by`` must be an admin."""
        _check_level(level)
        self._change(agent, level, by, "grant")

    def revoke(self, agent: str, *, by: str) -> None:
        """Takes ``agent`` off the list; ``by`` must be an admin."""
        self._change(agent, None, by, "revoke")

    def agent(self, name: str) -> AgentStore:
        """The store as agent ``name`` may use it."""
        return AgentStore(self, name)

    # The audit log.

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write of the store whose audit rows commit with it (module docstring);
        nested calls join the outer one."""
        if getattr(self._local, "rows", None) is not None:
            with self.store.transaction():
                yield
            return
        self._local.rows = rows = []
        try:
            with self.store.transaction():
                yield
                self._append(rows)
        except BaseException:
            # Reads and denials happened, whatever became of the transaction; writes did not.
            happened = [r for r in rows if not r[4] or NEEDS[r[2]] == "read"]
            if happened:
                with self.store.transaction():
                    self._append(happened)
            raise
        finally:
            self._local.rows = None

    def _append(self, rows: list[tuple]) -> None:
        for row in rows:
            self.store.execute(
                "INSERT INTO audit (time, agent, action, record_ids, allowed, detail) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )

    def _log(self, agent: str, action: str, ids: Iterable[str], allowed: bool, detail="") -> None:
        """Queues an audit row in the open transaction (every audited call opens one)."""
        row = (self.store.clock(), agent, action, json.dumps(list(ids)), int(allowed), detail)
        self._local.rows.append(row)

    def check(self, agent: str, action: str, ids: Sequence[str] = (), detail: str = "") -> None:
        """Raises :class:`PermissionDenied`, audited, unless ``agent`` may do ``action``
        (call it inside :meth:`transaction`)."""
        if not self.allows(agent, action):
            self._log(agent, action, ids, False, detail)
            raise PermissionDenied(
                f"agent {agent!r} may not {action} in memory space {self.store.space!r}: that "
                f"needs {NEEDS[action]} access and it has {self.level(agent) or 'none'} "
                f"(the attempt is audited)"
            )

    def audited(
        self,
        agent: str,
        action: str,
        run: Callable[[], Any],
        ids: Sequence[str] = (),
        found: Callable[[Any], Iterable[str]] = lambda result: (),
        detail: str = "",
    ) -> Any:
        """``run()`` as ``agent``'s ``action`` on ``ids``, checked and audited with the ids it
        names and those ``found`` reads from its result."""
        with self.transaction():
            self.check(agent, action, ids, detail)
            result = run()
            self._log(agent, action, [*ids, *found(result)], True, detail)
        return result

    def audit_log(
        self, *, agent: str | None = None, action: str | None = None, allowed: bool | None = None
    ) -> list[AuditEntry]:
        """The log's rows (of ``agent``, ``action``, allowed or not), oldest first: the space
        owner's view; agents have none."""
        clauses, params = ["TRUE"], []
        for column, value in (("agent", agent), ("action", action), ("allowed", allowed)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(int(value) if column == "allowed" else value)
        rows = self.store.execute(
            "SELECT seq, time, agent, action, record_ids, allowed, detail FROM audit "
            f"WHERE {' AND '.join(clauses)} ORDER BY seq",
            params,
        )
        return [
            AuditEntry(seq, time, who, what, tuple(json.loads(ids)), bool(ok), detail)
            for seq, time, who, what, ids, ok, detail in rows
        ]


def _ids(records) -> list[str]:
    return [r.id for r in records]


class AgentStore:
    """The store of a :class:`SharedSpace` as one agent may use it: the methods of
    :class:`~agentic_jax.memory.store.MemoryStore` (same arguments), each checked against the
    agent's level and audited; :class:`PermissionDenied` when not allowed."""

    def __init__(self, shared: SharedSpace, agent: str):
        if not agent:
            raise ValueError("an agent in a shared space has a name")
        self.shared, self.agent = shared, agent
        store = shared.store
        self.space, self.path, self.clock = store.space, store.path, store.clock

    @property
    def dim(self) -> int | None:
        return self.shared.store.dim

    def transaction(self):
        return self.shared.transaction()

    def _run(self, action: str, *args, ids=(), found=lambda result: (), detail="", **kwargs):
        method = getattr(self.shared.store, action)
        return self.shared.audited(
            self.agent, action, lambda: method(*args, **kwargs), list(ids), found, detail
        )

    def get(self, id: str) -> MemoryRecord | None:
        return self._run("get", id, ids=[id])

    def records(self, **filters) -> list[MemoryRecord]:
        return self._run("records", found=_ids, **filters)

    def search(self, embedding, k: int | None, **filters) -> list[tuple[MemoryRecord, float]]:
        return self._run(
            "search", embedding, k, found=lambda hits: _ids(r for r, _ in hits), **filters
        )

    def touch(self, ids: Iterable[str], at: float | None = None) -> None:
        ids = list(ids)
        self._run("touch", ids, at, ids=ids)

    def add(self, records: MemoryRecord | Iterable[MemoryRecord]) -> list[str]:
        records = [records] if isinstance(records, MemoryRecord) else list(records)
        return self._run("add", records, ids=_ids(records))

    def update(self, id: str, *, user: str, **changes) -> MemoryRecord:
        return self._run("update", id, ids=[id], user=user, **changes)

    def invalidate(self, id: str, at: float, *, now: float | None = None) -> MemoryRecord:
        return self._run("invalidate", id, at, ids=[id], now=now)

    def delete(self, ids: Iterable[str], *, user: str) -> int:
        ids = list(ids)
        return self._run("delete", ids, ids=ids, user=user)

    def forget_user(self, user: str) -> int:
        return self._run("forget_user", user, detail=f"user {user}")

    def clear(self, space: str) -> int:
        return self._run("clear", space, detail=f"space {space}")
