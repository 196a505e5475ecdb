"""The memory store: a writer SIGKILLed mid-transaction never corrupts the file or loses a
committed record; migrations, scoped deletes, bi-temporal invalidation, search, concurrency."""

import random
import signal
import sqlite3
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from killed_runs import ENV

from agentic_jax.agents.protocols.skills import SkillRegistry
from agentic_jax.memory import MIGRATIONS, SCHEMA_VERSION, MemoryRecord, MemoryStore, migrate

WRITER = """
    import sys
    import numpy as np
    from agentic_jax.memory import MemoryRecord, MemoryStore

    root, run = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(abs(hash(run)) % 2**32)
    store = MemoryStore(root, "crash", dim=8)
    print("writing", flush=True)
    for batch in range(10**6):
        store.add([
            MemoryRecord(
                id=f"{run}-{batch}-{i}", text=f"note {i} " + "x" * int(rng.integers(1, 1000)),
                user="u", importance=1.0, embedding=rng.normal(size=8),
                metadata={"batch": f"{run}-{batch}"},
            )
            for i in range(BATCH)
        ])
        sys.stdout.write(f"{run}-{batch}\\n")  # only after the commit returned
        sys.stdout.flush()
"""
BATCH = 20


def test_sigkilled_writers_never_corrupt_the_file_or_lose_a_commit(tmp_path):
    """12 writers, each SIGKILLed a random time after it starts writing batches of 20 records
    (one transaction a batch, where a writer spends most of its time); after each, the file passes
    ``integrity_check``, holds every batch the writer reported committed, and every batch
    whole or not at all."""
    script = tmp_path / "writer.py"
    script.write_text(f"BATCH = {BATCH}\n" + textwrap.dedent(WRITER))
    rng = random.Random(25)
    committed: set[str] = set()
    for run in range(12):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "db"), f"r{run}"],
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout.readline() == "writing\n", proc.stderr.read()
            try:  # a random kill point: the event above plus a random delay
                proc.wait(timeout=rng.uniform(0.0, 0.15))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            assert proc.returncode == -signal.SIGKILL, proc.stderr.read()
            reported = [line[:-1] for line in proc.stdout.read().splitlines(keepends=True)]
            committed |= {b for b in reported if b}
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with MemoryStore(tmp_path / "db", "crash") as store:
            assert store.integrity() == "ok"
            batches: dict[str, int] = {}
            for record in store.records(history=True):
                batches[record.metadata["batch"]] = batches.get(record.metadata["batch"], 0) + 1
        assert committed <= set(batches), f"lost commits: {committed - set(batches)}"
        assert set(batches.values()) <= {BATCH}, "a transaction was stored in part"
    # Beyond the reported commits, at most the one in flight per writer (committed, then killed
    # before it could say so).
    assert len(committed) > 20 and len(set(batches) - committed) <= 20


def _v1_file(path, rows):
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, target=1)
    conn.executemany(
        "INSERT INTO memories (id, space, user, type, text, importance, created_at, accessed_at)"
        " VALUES (?, 'old', 'ann', 'semantic', ?, 3.0, 10.0, 20.0)",
        rows,
    )
    conn.close()


def test_an_old_file_is_migrated_in_order_and_a_newer_one_refused(tmp_path):
    _v1_file(tmp_path / "old.db", [("a", "Ann likes tea"), ("b", "Ann lives in Oslo")])
    with MemoryStore(tmp_path, "old") as store:
        version = store._conn.execute("SELECT version FROM schema_version").fetchone()[0]
        assert version == SCHEMA_VERSION == len(MIGRATIONS) == 6
        old = store.get("a")
        assert (old.text, old.importance, old.created_at, old.accessed_at) == (
            "Ann likes tea",
            3.0,
            10.0,
            20.0,
        )
        assert (old.tools, old.valid_from, old.valid_to, old.expired_at) == ((), None, None, None)
        store.add(MemoryRecord(id="c", text="Ann is a chemist", user="ann", importance=5.0))
        assert [r.id for r in store.records(user="ann")] == ["a", "b", "c"]
        store._conn.execute("UPDATE schema_version SET version = 99")
    with pytest.raises(ValueError, match="newer"):
        MemoryStore(tmp_path, "old")


def _record(id, user, text="a note", **fields):
    return MemoryRecord(id=id, text=text, user=user, importance=1.0, **fields)


def test_deletes_are_scoped_to_one_user_or_one_named_space(tmp_path):
    store, other = MemoryStore(tmp_path, "team"), MemoryStore(tmp_path, "home")
    store.add([_record(f"{u}{i}", u) for u in "ab" for i in range(3)])
    other.add([_record("a0", "a")])
    assert store.delete(["a0", "b0", "zz"], user="a") == 1  # b0 is not a's
    assert {r.id for r in store.records()} == {"a1", "a2", "b0", "b1", "b2"}
    assert store.forget_user("b") == 3
    assert {r.id for r in store.records()} == {"a1", "a2"}
    with pytest.raises(ValueError, match="not 'home'"):
        store.clear("home")
    assert store.clear("team") == 2 and store.records() == []
    assert [r.id for r in other.records()] == ["a0"]  # another space is another file
    with pytest.raises(TypeError):
        store.delete(["a1"])  # no user: no delete


def test_invalidation_closes_validity_and_keeps_history_queryable(tmp_path):
    clock = iter([100.0, 200.0, 300.0]).__next__
    store = MemoryStore(tmp_path, clock=lambda: 1000.0)
    store.clock = clock  # store times: the old fact at 100, the new at 200, reading at 300
    store.add(_record("old", "ann", "Ann lives in Oslo", valid_from=0.0))
    store.add(_record("new", "ann", "Ann lives in Rome", valid_from=150.0))
    closed = store.invalidate("old", at=150.0, now=250.0)
    assert (closed.valid_to, closed.expired_at) == (150.0, 250.0)

    def ids(**when):
        store.clock = lambda: 300.0
        return [r.id for r in store.records(user="ann", **when)]

    assert ids() == ["new"]  # now, as known now
    assert ids(valid_at=120.0) == ["old"]  # what was true at 120
    assert ids(valid_at=160.0, known_at=220.0) == ["old", "new"]  # before the store knew
    assert ids(valid_at=160.0) == ["new"]
    assert ids(known_at=150.0) == ["old"]  # the new fact was not stored yet
    assert ids(history=True) == ["old", "new"]
    with pytest.raises(ValueError, match="no longer valid"):
        store.invalidate("old", at=160.0)
    with pytest.raises(ValueError, match="before it began"):
        store.invalidate("new", at=100.0)


def test_search_is_exact_cosine_top_k_over_the_filtered_records(tmp_path):
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 8)).astype(np.float32)
    store = MemoryStore(tmp_path)
    store.add(
        _record(str(i), "ab"[i % 2], embedding=v, type=("episodic", "semantic")[i % 3 == 0])
        for i, v in enumerate(vectors)
    )
    store.add(_record("plain", "a"))  # no embedding: never found by search
    query = rng.normal(size=8)
    cosine = vectors @ query / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query)
    for user, types in (("a", None), ("b", ["semantic"]), (None, None)):
        keep = [
            i
            for i in range(30)
            if user in (None, "ab"[i % 2])
            and (types is None or ("episodic", "semantic")[i % 3 == 0] in types)
        ]
        want = sorted(keep, key=lambda i: -cosine[i])[:5]
        found = store.search(query, 5, user=user, types=types)
        assert [r.id for r, _ in found] == [str(i) for i in want]
        np.testing.assert_allclose([s for _, s in found], cosine[want], atol=1e-5)
    assert len(store.search(query, None)) == 30
    with pytest.raises(ValueError, match="8-d"):
        store.add(_record("bad", "a", embedding=np.ones(4)))
    with pytest.raises(ValueError, match="4-d"):
        MemoryStore(tmp_path, dim=4)


def test_records_are_typed_and_procedures_link_to_registered_skills(tmp_path):
    skills = SkillRegistry.load()
    store = MemoryStore(tmp_path, skills=skills)
    store.add(
        MemoryRecord(
            text="17 * 23 + 100 by calculator, checked",
            user="u",
            type="procedural",
            tools=["calculator", "calculator"],
            skill="arithmetic",
            importance=4.0,
        )
    )
    assert store.records()[0].tools == ("calculator", "calculator")
    with pytest.raises(ValueError, match="unknown skill"):
        store.add(_record("j", "u", type="procedural", tools=["x"], skill="juggling"))
    with pytest.raises(ValueError, match="context window"):
        store.add(MemoryRecord(text="t", user="u", type="working", importance=1.0))
    with pytest.raises(ValueError, match="belongs to episodic"):
        MemoryRecord(text="t", user="u", type="semantic", outcome="won")
    with pytest.raises(ValueError, match="tool sequence"):
        MemoryRecord(text="t", user="u", type="procedural")
    with pytest.raises(ValueError, match="confidence"):
        MemoryRecord(text="t", user="u", confidence=1.5)
    store.add(
        [
            _record("f", "u", provenance="user said so", confidence=0.9),
            _record("e", "u", type="episodic", event_time=5.0, outcome="won"),
        ]
    )
    assert [(r.provenance, r.outcome) for r in store.records(types=["semantic", "episodic"])] == [
        ("user said so", None),
        (None, "won"),
    ]


def test_readers_read_while_a_writer_holds_the_lock_and_a_second_writer_waits(tmp_path):
    writer = MemoryStore(tmp_path, busy_timeout=0.2)
    reader = MemoryStore(tmp_path, busy_timeout=0.2)
    second = MemoryStore(tmp_path, busy_timeout=0.2)
    writer.add(_record("first", "u"))
    with writer.transaction():
        writer.add(_record("pending", "u"))
        assert [r.id for r in reader.records()] == ["first"]  # the last committed snapshot
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            second.add(_record("blocked", "u"))
    assert [r.id for r in reader.records()] == ["first", "pending"]


def test_a_full_disk_fails_the_write_in_flight_and_loses_nothing_committed(tmp_path):
    """A database that cannot grow (``max_page_count``, SQLite's stand-in for a full disk) fails
    the batch being written with SQLite's own error; the file stays sound, every batch committed
    before it is whole, the failed one is absent, and the store writes again once there is room."""
    store = MemoryStore(tmp_path, "full", dim=8)
    pages = store.execute("PRAGMA page_count")[0][0]
    store.execute(f"PRAGMA max_page_count = {pages + 16}")
    rng = np.random.default_rng(0)

    def batch(b):
        return [
            MemoryRecord(
                id=f"{b}-{i}", text="x" * 2000, user="u", importance=1.0,
                embedding=rng.normal(size=8),
            )
            for i in range(4)
        ]  # fmt: skip

    committed = 0
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for b in range(1000):
            store.add(batch(b))
            committed += 1
    assert committed > 0
    store.execute(f"PRAGMA max_page_count = {pages + 10_000}")
    store.add(batch("after"))
    store.close()
    reopened = MemoryStore(tmp_path, "full", dim=8)
    assert reopened.integrity() == "ok"
    ids = {r.id for r in reopened.records(user="u")}
    assert ids == {f"{b}-{i}" for b in [*range(committed), "after"] for i in range(4)}
