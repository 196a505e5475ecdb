"""Shared memory spaces: per-agent read/write/admin levels and the append-only audit log."""

import sqlite3

import numpy as np
import pytest

from agentic_jax.memory import (
    HashingEmbedder,
    MemoryReader,
    MemoryRecord,
    MemoryStore,
    MemoryWriter,
    PermissionDenied,
    SharedSpace,
)
from agentic_jax.memory.permissions import OWNER

ACL = {"lead": "admin", "writer": "write", "reader": "read"}


@pytest.fixture
def space(tmp_path):
    ticks = iter(range(1000, 10**6))
    store = MemoryStore(tmp_path, "team", clock=lambda: float(next(ticks)))
    yield SharedSpace(store, ACL)
    store.close()


def _fact(text, user="ann"):
    return MemoryRecord(
        text=text, user=user, importance=5.0, embedding=HashingEmbedder(16)([text])[0]
    )


def test_an_agent_without_write_access_cannot_write_and_the_attempt_is_audited(space):
    fact = _fact("The release is on Friday")
    for agent in ("reader", "stranger"):
        with pytest.raises(PermissionDenied, match=f"agent '{agent}' may not add.*audited"):
            space.agent(agent).add(fact)
    assert space.store.records() == []
    denied = space.audit_log(allowed=False)
    assert [(e.agent, e.action, e.record_ids, e.allowed) for e in denied] == [
        ("reader", "add", (fact.id,), False),
        ("stranger", "add", (fact.id,), False),
    ]
    assert denied[0].time < denied[1].time
    # The writer may; its write and its audit row commit together.
    assert space.agent("writer").add(fact) == [fact.id]
    [entry] = space.audit_log(agent="writer")
    assert (entry.action, entry.record_ids, entry.allowed) == ("add", (fact.id,), True)
    for call in (
        lambda view: view.update(fact.id, user="ann", importance=9.0),
        lambda view: view.invalidate(fact.id, 5.0),
        lambda view: view.delete([fact.id], user="ann"),
    ):
        with pytest.raises(PermissionDenied):
            call(space.agent("reader"))
    assert space.store.get(fact.id).importance == 5.0 and space.store.get(fact.id).valid_to is None
    assert [e.action for e in space.audit_log(agent="reader", allowed=False)] == [
        "add",
        "update",
        "invalidate",
        "delete",
    ]


def test_reads_need_read_access_and_are_audited_with_the_ids_returned(space):
    space.agent("writer").add([_fact("Ann likes tea"), _fact("Bob likes coffee", "bob")])
    ids = [r.id for r in space.store.records()]
    assert [r.id for r in space.agent("reader").records()] == ids
    hits = space.agent("reader").search(HashingEmbedder(16)(["Ann likes tea"])[0], 1)
    assert hits[0][0].text == "Ann likes tea"
    assert space.agent("reader").get("missing") is None
    for call in (
        lambda view: view.records(),
        lambda view: view.search(np.ones(16), 1),
        lambda view: view.get(ids[0]),
    ):
        with pytest.raises(PermissionDenied, match="needs read access and it has none"):
            call(space.agent("stranger"))
    log = space.audit_log(agent="reader")
    assert [(e.action, e.record_ids) for e in log] == [
        ("records", tuple(ids)),
        ("search", (ids[0],)),
        ("get", ("missing",)),
    ]
    assert [(e.action, e.record_ids) for e in space.audit_log(agent="stranger")] == [
        ("records", ()),
        ("search", ()),
        ("get", (ids[0],)),
    ]


def test_policies_run_through_a_view_and_a_denied_write_keeps_its_read_in_the_log(space):
    embed = HashingEmbedder(64)
    assert (
        MemoryWriter(space.agent("writer"), embed)
        .write(MemoryRecord(text="The deploy key rotates monthly", user="ann"))
        .action
        == "added"
    )
    [recall] = MemoryReader(space.agent("reader"), embed).read("deploy key", user="ann")
    assert recall.record.text == "The deploy key rotates monthly"
    assert [e.action for e in space.audit_log(agent="reader")] == ["search", "touch"]
    # The write policy reads (duplicate check), then writes, in one transaction: the denied
    # write rolls it back, yet the read and the denial stay in the log.
    with pytest.raises(PermissionDenied):
        MemoryWriter(space.agent("reader"), embed).write(
            MemoryRecord(text="Deploys happen on Tuesdays", user="ann")
        )
    assert len(space.store.records()) == 1
    last = space.audit_log(agent="reader")[-2:]
    assert [(e.action, e.allowed) for e in last] == [("search", True), ("add", False)]


def test_only_admins_change_the_list_and_a_space_keeps_an_admin(space):
    with pytest.raises(PermissionDenied, match="may not grant"):
        space.grant("writer", "admin", by="writer")
    assert space.level("writer") == "write"
    space.grant("stranger", "read", by="lead")
    space.revoke("reader", by="lead")
    assert space.acl() == {"lead": "admin", "stranger": "read", "writer": "write"}
    with pytest.raises(ValueError, match="without an admin"):
        space.revoke("lead", by="lead")
    with pytest.raises(ValueError, match="access level"):
        space.grant("x", "owner", by="lead")
    with pytest.raises(PermissionDenied):
        space.agent("reader").records()
    with pytest.raises(PermissionDenied, match="needs admin"):
        space.agent("writer").forget_user("ann")
    changes = [(e.agent, e.action, e.allowed, e.detail) for e in space.audit_log()]
    assert changes[:3] == [(OWNER, "grant", True, f"{a}: {lvl}") for a, lvl in ACL.items()]
    assert changes[3:] == [
        ("writer", "grant", False, "writer: admin"),
        ("lead", "grant", True, "stranger: read"),
        ("lead", "revoke", True, "reader: none"),
        ("reader", "records", False, ""),
        ("writer", "forget_user", False, "user ann"),
    ]


def test_the_list_founds_a_space_once_and_persists_with_its_log(tmp_path, space):
    with pytest.raises(PermissionDenied):
        space.agent("stranger").records()
    path = space.store.path
    space.store.close()
    with MemoryStore(path.parent, "team") as store:
        reopened = SharedSpace(store)
        assert reopened.acl() == ACL and SharedSpace(store, ACL).acl() == ACL
        assert [e.agent for e in reopened.audit_log(allowed=False)] == ["stranger"]
        with pytest.raises(ValueError, match="already has the access list"):
            SharedSpace(store, {"lead": "admin"})
    with MemoryStore(tmp_path, "other") as store:
        with pytest.raises(ValueError, match="needs an admin"):
            SharedSpace(store, {"a": "write"})
        assert SharedSpace(store).acl() == {}
        with pytest.raises(PermissionDenied):  # a space without a list: nobody may do anything
            SharedSpace(store).agent("a").records()


def test_the_audit_log_is_append_only(space):
    with pytest.raises(PermissionDenied):
        space.agent("stranger").records()
    before = space.audit_log()
    for statement in ("UPDATE audit SET allowed = 1", "DELETE FROM audit"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"), space.store.transaction():
            space.store.execute(statement)
    assert space.audit_log() == before
    space.store.clear("team")  # clearing the memories leaves the log
    assert space.audit_log() == before
