"""The memory store: one SQLite file per memory space, crash-safe, read concurrently.

**Why SQLite.**  An agent's memory outlives its process and must survive that process being
killed at any instant.  SQLite (the standard library's ``sqlite3``) gives atomic, durable
transactions in one file: the write-ahead log (``journal_mode=WAL``) appends each transaction
to ``<space>.db-wal`` and a commit is one more frame, so a process killed mid-transaction leaves
a log whose unfinished tail the next open ignores.  A crash (SIGKILL, a full disk, which SQLite
turns into a rolled-back transaction) loses at most the transaction in flight and never
corrupts the file; ``synchronous=FULL`` (the default) fsyncs every commit, so a committed
record survives power loss too (``NORMAL`` survives a process crash only, and is faster).

**Concurrency: many readers, one writer.**  In WAL mode readers never block and are never
blocked: each reads the last snapshot committed when its read began.  Writers are serialised:
every write runs in ``BEGIN IMMEDIATE``, which takes the database's write lock when the
transaction *starts* (not at its first write, where two deferred transactions could deadlock
upgrading their locks); a second writer, in this process or another, waits up to
``busy_timeout`` seconds for it, then fails with ``sqlite3.OperationalError``.  Inside one
process a lock serialises the threads sharing a store's connection.  :meth:`MemoryStore.
transaction` makes several calls one atomic write (the write policy's duplicate check and
insert, so another writer cannot slip a duplicate between them).

**Schema migrations.**  ``schema_version`` holds the file's version; :data:`MIGRATIONS` are
the steps from each version to the next, applied in order, all in one transaction, when an
older file is opened (a crash mid-migration leaves the old version intact).  A file newer than
this code is refused.  A new column is a new migration appended to the list, never an edit of
an old one.

**Search.**  Embeddings are float32 blobs beside their text (the dimension fixed per space and
checked on every write).  Top-k is exact cosine similarity in JAX over the loaded vectors,
:func:`agentic_jax.retrieval.exact_top_k`; the vectors are padded to a power of two rows (the
padding masked), so ``jit`` compiles once per size class, not per write.

**Deletion is always scoped.**  :meth:`~MemoryStore.delete` removes ids of one user,
:meth:`~MemoryStore.forget_user` one user's records, :meth:`~MemoryStore.clear` the space,
named again by the caller; there is no call that deletes across spaces, and since each space
is its own file no query can reach another.  Contradicted facts are not deleted at all but
invalidated (:meth:`~MemoryStore.invalidate`; see :mod:`agentic_jax.memory.records`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from pathlib import Path

import gin
import numpy as np

from agentic_jax.memory.records import STORED_TYPES, MemoryRecord

# Each entry takes the schema from its index's version to the next (version 0: an empty file).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the record and the space's settings
        """CREATE TABLE memories (
            id TEXT PRIMARY KEY,
            space TEXT NOT NULL,
            user TEXT NOT NULL,
            type TEXT NOT NULL,
            text TEXT NOT NULL,
            embedding BLOB,
            importance REAL NOT NULL,
            created_at REAL NOT NULL,
            accessed_at REAL NOT NULL,
            source TEXT NOT NULL DEFAULT '',
            links TEXT NOT NULL DEFAULT '[]',
            metadata TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX memories_user ON memories (space, user, type)",
        "CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ),
    (  # 2: the fields of episodic, semantic and procedural memories
        "ALTER TABLE memories ADD COLUMN event_time REAL",
        "ALTER TABLE memories ADD COLUMN outcome TEXT",
        "ALTER TABLE memories ADD COLUMN provenance TEXT",
        "ALTER TABLE memories ADD COLUMN confidence REAL",
        "ALTER TABLE memories ADD COLUMN tools TEXT NOT NULL DEFAULT '[]'",
        "ALTER TABLE memories ADD COLUMN skill TEXT",
    ),
    (  # 3: bi-temporal validity (world time) and expiry (store time)
        "ALTER TABLE memories ADD COLUMN valid_from REAL",
        "ALTER TABLE memories ADD COLUMN valid_to REAL",
        "ALTER TABLE memories ADD COLUMN expired_at REAL",
    ),
    (  # 4: graph memory's facts, bi-temporal like the records (memory.graph)
        """CREATE TABLE triples (
            id INTEGER PRIMARY KEY,
            user TEXT NOT NULL,
            subject TEXT NOT NULL,
            relation TEXT NOT NULL,
            object TEXT NOT NULL,
            subject_key TEXT NOT NULL,
            relation_key TEXT NOT NULL,
            object_key TEXT NOT NULL,
            source TEXT,
            valid_from REAL,
            valid_to REAL,
            created_at REAL NOT NULL,
            expired_at REAL
        )""",
        "CREATE INDEX triples_fact ON triples (user, subject_key, relation_key)",
    ),
    (  # 5: shared spaces' access lists and their append-only audit log (memory.permissions)
        "CREATE TABLE acl (agent TEXT PRIMARY KEY, level TEXT NOT NULL)",
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            time REAL NOT NULL,
            agent TEXT NOT NULL,
            action TEXT NOT NULL,
            record_ids TEXT NOT NULL,
            allowed INTEGER NOT NULL,
            detail TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit "
        "BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END",
        "CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit "
        "BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END",
    ),
    (  # 6: the log of update and consolidation decisions, with their inputs (memory.update)
        """CREATE TABLE decisions (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            time REAL NOT NULL,
            user TEXT NOT NULL,
            action TEXT NOT NULL,
            text TEXT NOT NULL,
            shown TEXT NOT NULL DEFAULT '[]',
            target TEXT,
            result TEXT,
            reason TEXT NOT NULL DEFAULT '',
            decider TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX decisions_user ON decisions (user, seq)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
COLUMNS = tuple(f.name for f in dataclasses.fields(MemoryRecord))  # one per field
_JSON = {"links", "metadata", "tools"}
_SPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Brings the file of ``conn`` (in autocommit mode) to schema version ``target`` in one
    transaction; the version it had."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
        row = conn.execute("SELECT version FROM schema_version").fetchone()
        if row is None:
            conn.execute("INSERT INTO schema_version VALUES (0)")
        old = 0 if row is None else row[0]
        if old > SCHEMA_VERSION:
            raise ValueError(
                f"memory file has schema version {old}, newer than this code's {SCHEMA_VERSION}"
            )
        for statements in MIGRATIONS[old:target]:
            for statement in statements:
                conn.execute(statement)
        conn.execute("UPDATE schema_version SET version = ?", (max(old, target),))
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return old


def _encode(record: MemoryRecord) -> tuple:
    values = []
    for name in COLUMNS:
        value = getattr(record, name)
        if name in _JSON:
            value = json.dumps(list(value) if isinstance(value, tuple) else value)
        elif name == "embedding" and value is not None:
            value = value.astype(np.float32).tobytes()
        values.append(value)
    return tuple(values)


def _decode(row: Sequence) -> MemoryRecord:
    fields = dict(zip(COLUMNS, row))
    for name in _JSON:
        fields[name] = json.loads(fields[name])
    if fields["embedding"] is not None:
        fields["embedding"] = np.frombuffer(fields["embedding"], np.float32)
    return MemoryRecord(**fields)


@gin.configurable(module="memory")
class MemoryStore:
    """The records of one memory space, in ``<root>/<space>.db`` (see the module docstring).

    ``dim`` fixes the embedding dimension (default: the first embedding stored; kept in the
    file).  ``skills``, anything supporting ``in`` (a :class:`~agentic_jax.agents.protocols.
    skills.SkillRegistry`), makes procedural records' ``skill`` a checked link to it.
    ``clock`` gives store time (``created_at``, ``accessed_at``, ``expired_at``) and "now".
    """

    def __init__(
        self,
        root: str | Path,
        space: str = "default",
        *,
        dim: int | None = None,
        skills: Container[str] | None = None,
        busy_timeout: float = 5.0,
        synchronous: str = "FULL",
        clock: Callable[[], float] = time.time,
    ):
        if not _SPACE.match(space):
            raise ValueError(f"a space name is a file name of letters, digits, '_.-': {space!r}")
        if synchronous not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, got {synchronous!r}")
        self.space, self.skills, self.clock = space, skills, clock
        self.path = Path(root) / f"{space}.db"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._lock = threading.RLock()
        self._depth = 0  # nesting of transaction()
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute(f"PRAGMA synchronous={synchronous}")
        migrate(self._conn)
        stored = self._setting("dim")
        if dim is not None and stored is not None and int(stored) != dim:
            raise ValueError(f"{self.path} holds {stored}-d embeddings, not {dim}-d")
        self.dim = int(stored) if stored is not None else dim

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> MemoryStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _setting(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM settings WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """One atomic write (``BEGIN IMMEDIATE``: the write lock from the start); nested calls
        join the outer transaction."""
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
                self._conn.execute("COMMIT")
            except BaseException:
                # SQLite has already rolled back after some errors (a full disk): rolling back
                # again would raise over the error that says what went wrong.
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def execute(self, statement: str, params: Sequence = ()) -> list[tuple]:
        """Runs one SQL statement on the file and returns its rows: the door for the package's
        own tables (``memory.graph``'s triples); a write belongs in :meth:`transaction`."""
        with self._lock:
            return self._conn.execute(statement, params).fetchall()

    def integrity(self) -> str:
        """``PRAGMA integrity_check``: ``"ok"`` for a sound file."""
        with self._lock:
            return "\n".join(r[0] for r in self._conn.execute("PRAGMA integrity_check"))

    # Writing.

    def _checked(self, record: MemoryRecord, now: float) -> MemoryRecord:
        if record.type not in STORED_TYPES:
            raise ValueError(
                f"{record.type} memory is the context window's: it is not stored "
                f"(see memory.working)"
            )
        if record.space not in ("", self.space):
            raise ValueError(f"record of space {record.space!r} in the {self.space!r} store")
        if record.importance is None:
            raise ValueError("a stored memory needs its importance (the write policy scores it)")
        if record.skill is not None and self.skills is not None and record.skill not in self.skills:
            raise ValueError(f"procedural memory links to unknown skill {record.skill!r}")
        if record.embedding is not None:
            if self._setting("dim") is None:  # the space's first embedding fixes its dimension
                self.dim = self.dim or record.embedding.shape[0]
                self._conn.execute("INSERT INTO settings VALUES ('dim', ?)", (str(self.dim),))
            if record.embedding.shape != (self.dim,):
                raise ValueError(
                    f"embedding of shape {record.embedding.shape} in a {self.dim}-d store"
                )
        created = now if record.created_at is None else record.created_at
        return dataclasses.replace(
            record,
            space=self.space,
            created_at=created,
            accessed_at=created if record.accessed_at is None else record.accessed_at,
        )

    def add(self, records: MemoryRecord | Iterable[MemoryRecord]) -> list[str]:
        """Stores new records in one transaction (all or none); their ids."""
        records = [records] if isinstance(records, MemoryRecord) else list(records)
        now = self.clock()
        with self.transaction():
            rows = [_encode(self._checked(r, now)) for r in records]
            self._conn.executemany(
                f"INSERT INTO memories ({', '.join(COLUMNS)}) "
                f"VALUES ({', '.join('?' * len(COLUMNS))})",
                rows,
            )
        return [r.id for r in records]

    def update(self, id: str, *, user: str, **changes) -> MemoryRecord:
        """Changes fields of ``user``'s record ``id`` (not its identity: id, space, user, type,
        creation time); the record as stored now."""
        fixed = {"id", "space", "user", "type", "created_at"} & set(changes)
        if fixed:
            raise ValueError(f"a memory's {sorted(fixed)} cannot change")
        with self.transaction():
            old = self.get(id)
            if old is None or old.user != user:
                raise KeyError(f"no memory {id!r} of user {user!r} in space {self.space!r}")
            new = self._checked(dataclasses.replace(old, **changes), self.clock())
            assignments = ", ".join(f"{c} = ?" for c in COLUMNS)
            self._conn.execute(
                f"UPDATE memories SET {assignments} WHERE id = ?", (*_encode(new), id)
            )
        return new

    def touch(self, ids: Iterable[str], at: float | None = None) -> None:
        """Records an access (recency restarts from it)."""
        at = self.clock() if at is None else at
        with self.transaction():
            self._conn.executemany(
                "UPDATE memories SET accessed_at = ? WHERE id = ? AND space = ?",
                [(at, i, self.space) for i in ids],
            )

    def invalidate(self, id: str, at: float, *, now: float | None = None) -> MemoryRecord:
        """Closes the validity of record ``id`` at world time ``at`` (the fact stopped holding
        then) and stamps its expiry in store time (``now``, default the clock): it stays in the
        store for as-of queries.  A record is invalidated once."""
        with self.transaction():
            old = self.get(id)
            if old is None:
                raise KeyError(f"no memory {id!r} in space {self.space!r}")
            if old.valid_to is not None:
                raise ValueError(f"memory {id!r} is no longer valid since {old.valid_to}")
            if old.valid_from is not None and at < old.valid_from:
                raise ValueError(f"{id!r} cannot end at {at}, before it began ({old.valid_from})")
            now = self.clock() if now is None else now
            self._conn.execute(
                "UPDATE memories SET valid_to = ?, expired_at = ? WHERE id = ? AND space = ?",
                (at, now, id, self.space),
            )
        return self.get(id)

    def delete(self, ids: Iterable[str], *, user: str) -> int:
        """Deletes those of ``ids`` that belong to ``user``; how many."""
        with self.transaction():
            return sum(
                self._conn.execute(
                    "DELETE FROM memories WHERE id = ? AND space = ? AND user = ?",
                    (i, self.space, user),
                ).rowcount
                for i in ids
            )

    def forget_user(self, user: str) -> int:
        """Deletes every record of ``user`` in this space; how many."""
        with self.transaction():
            return self._conn.execute(
                "DELETE FROM memories WHERE space = ? AND user = ?", (self.space, user)
            ).rowcount

    def clear(self, space: str) -> int:
        """Deletes every record of this space, which the caller names (a guard against
        clearing the wrong store); how many."""
        if space != self.space:
            raise ValueError(f"this store is space {self.space!r}, not {space!r}")
        with self.transaction():
            return self._conn.execute(
                "DELETE FROM memories WHERE space = ?", (self.space,)
            ).rowcount

    # Reading.

    def get(self, id: str) -> MemoryRecord | None:
        with self._lock:
            row = self._conn.execute(
                f"SELECT {', '.join(COLUMNS)} FROM memories WHERE id = ? AND space = ?",
                (id, self.space),
            ).fetchone()
        return None if row is None else _decode(row)

    def records(
        self,
        *,
        user: str | None = None,
        types: Sequence[str] | None = None,
        valid_at: float | None = None,
        known_at: float | None = None,
        history: bool = False,
    ) -> list[MemoryRecord]:
        """The records (of ``user``, of ``types``) valid at world time ``valid_at`` as the store
        knew them at store time ``known_at`` (both default: now), oldest first.  ``history``
        drops the validity filter: every record the store held at ``known_at``, invalidated
        ones too."""
        rows = self._select(
            ", ".join(COLUMNS),
            user=user,
            types=types,
            valid_at=valid_at,
            known_at=known_at,
            history=history,
        )
        return [_decode(r) for r in rows]

    def _select(
        self,
        columns: str,
        *,
        user=None,
        types=None,
        valid_at=None,
        known_at=None,
        history=False,
        extra="TRUE",
    ) -> list:
        """``columns`` of the rows :meth:`records` filters (and ``extra``), oldest first."""
        clauses, params = ["space = ?", extra], [self.space]
        if user is not None:
            clauses.append("user = ?")
            params.append(user)
        if types is not None:
            clauses.append(f"type IN ({', '.join('?' * len(types))})")
            params += list(types)
        now = self.clock()
        known = now if known_at is None else known_at
        clauses.append("created_at <= ?")
        params.append(known)
        if not history:
            # Valid at `valid_at` as the store knew it at `known`: an end stamped after then was
            # not known yet.
            clauses.append(
                "(valid_from IS NULL OR valid_from <= ?) AND "
                "(valid_to IS NULL OR valid_to > ? OR expired_at > ?)"
            )
            valid = now if valid_at is None else valid_at
            params += [valid, valid, known]
        with self._lock:
            return self._conn.execute(
                f"SELECT {columns} FROM memories WHERE {' AND '.join(clauses)} "
                "ORDER BY created_at, rowid",
                params,
            ).fetchall()

    def search(self, embedding, k: int | None, **filters) -> list[tuple[MemoryRecord, float]]:
        """The ``k`` records (filtered as in :meth:`records`: ``user``, ``types``, ``valid_at``,
        ``known_at``, ``history``) whose embeddings are nearest ``embedding`` by cosine
        similarity, best first, with their similarities; fewer if fewer have embeddings
        (``k=None``: all that do).  Ties go to the record created first."""
        # JAX is imported on the first search, not with the store: a process that only writes
        # (an agent's event logger, the crash tests' writers) starts ten times faster.
        from agentic_jax.retrieval.dense import exact_top_k

        if k is not None and k < 1:
            raise ValueError(f"k must be positive, got {k}")
        rows = self._select("id, embedding", extra="embedding IS NOT NULL", **filters)
        if not rows:
            return []
        query = np.asarray(embedding, np.float32)
        if query.shape != (self.dim,):
            raise ValueError(f"query of shape {query.shape} in a {self.dim}-d store")
        vectors = np.zeros((1 << (len(rows) - 1).bit_length(), self.dim), np.float32)
        vectors[: len(rows)] = [np.frombuffer(blob, np.float32) for _, blob in rows]
        scores, best = exact_top_k(
            query[None],
            vectors,
            len(rows) if k is None else min(k, len(rows)),
            metric="cosine",
            valid=np.arange(len(vectors)) < len(rows),
        )
        found = []
        for score, row in zip(np.asarray(scores[0]), np.asarray(best[0])):
            found.append((self.get(rows[row][0]), float(score)))
        return found
