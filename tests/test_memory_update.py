"""Memory updates and consolidation: Mem0's extract-then-decide (a contradiction is an UPDATE
that closes the old fact's validity, a duplicate a NOOP, a delete scoped to its user, every
decision logged), A-MEM links, reflection at its threshold, tiering by importance × recency,
and sleep-time consolidation that changes nothing when run twice."""

import json
import logging
import string
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.agents.context.manager import ContextManager
from agentic_jax.cli import main
from agentic_jax.memory import (
    Decision,
    Fact,
    FactExtractor,
    HashingEmbedder,
    MemoryRecord,
    MemoryStore,
    MemoryUpdater,
    ModelDecider,
    NoteLinker,
    Reflector,
    Tiers,
    WorkingMemory,
    consolidate,
    decisions,
    parse_facts,
)

HOUR = 3600.0
embed = HashingEmbedder(64)


class Clock:
    def __init__(self, t=1000 * HOUR):
        self.t = t

    def __call__(self):
        return self.t


def scripted(answers, calls=None):
    """A generator answering by prompt content: the answer of the first key in the prompt."""

    def generate(prompt):
        if calls is not None:
            calls.append(prompt)
        return next((a for key, a in answers.items() if key in prompt), "")

    return generate


EXTRACT = scripted(
    {
        "I live in Oslo": "(Ann | lives in | Oslo)\nAnn seems nice",
        "moved to Lyon": "- (Ann | lives in | Lyon)",
        "gave the cat away": "NOT (Ann | has | a cat)",
        "nothing": "NONE",
    }
)


def test_facts_are_parsed_strictly():
    facts, rejected = parse_facts("(A | likes | tea)\n2. NOT (A | has | *)\nNONE\nA likes tea\n")
    assert facts == [Fact.triple("A", "likes", "tea"), Fact.triple("A", "has", "*", True)]
    assert rejected == ["A likes tea"]
    assert facts[1].line() == "NOT (A | has | *)"


@pytest.mark.parametrize("decider", ["rules", "model", "unreadable model"])
def test_a_contradiction_is_an_update_that_closes_the_old_validity(tmp_path, decider, caplog):
    clock = Clock(100.0)
    store = MemoryStore(tmp_path, clock=clock)
    model = {
        "rules": None,
        "model": ModelDecider(scripted({"Lyon": "UPDATE 1 -- she moved", "Oslo": "ADD -- new"})),
        "unreadable model": ModelDecider(scripted({"Lyon": "I think so?", "Oslo": "ADD"})),
    }[decider]
    updater = MemoryUpdater(store, embed, extractor=FactExtractor(EXTRACT), decider=model)
    with caplog.at_level(logging.WARNING):
        [first] = updater.update("I live in Oslo, by the fjord", user="ann")
    assert "Ann seems nice" in caplog.text  # the line that is not a fact, logged and dropped
    assert (first.action, first.fact.object) == ("ADD", "Oslo")
    assert updater.update("nothing new", user="ann") == []

    clock.t = 200.0
    [second] = updater.update("I moved to Lyon", user="ann")
    assert (second.action, second.target) == ("UPDATE", first.id)
    old, new = store.get(first.id), store.get(second.id)
    assert (old.valid_to, old.expired_at) == (200.0, 200.0)  # closed, not deleted
    assert (new.valid_from, new.links, new.metadata["replaces"]) == (200.0, (old.id,), old.id)
    assert second.id in old.links
    assert [r.text for r in store.records(user="ann")] == ["Ann lives in Lyon"]
    # As of before the change, the old fact; and what the store believed then.
    assert [r.text for r in store.records(user="ann", valid_at=150.0)] == ["Ann lives in Oslo"]
    assert [r.text for r in store.records(user="ann", known_at=150.0)] == ["Ann lives in Oslo"]
    assert len(store.records(user="ann", history=True)) == 2

    log = decisions(store, user="ann")
    assert [(d.action, d.time, d.target, d.result) for d in log] == [
        ("ADD", 100.0, None, first.id),
        ("UPDATE", 200.0, first.id, second.id),
    ]
    assert log[1].text == "(Ann | lives in | Lyon)"
    assert [i for i, _ in log[1].shown] == [first.id] and log[1].shown[0][1] > 0
    assert log[1].decider == ("RuleDecider" if decider == "rules" else "ModelDecider")
    if decider == "model":
        assert log[1].reason == "she moved"
    if decider == "unreadable model":
        assert "fallback" in log[1].reason and "unreadable reply" in caplog.text


@settings(max_examples=20, deadline=None)
@given(
    text=st.text(string.ascii_letters + " ", min_size=1, max_size=40).filter(str.strip),
    triple=st.booleans(),
)
def test_adding_the_same_memory_twice_is_a_noop_never_a_delete(text, triple):
    fact = Fact.triple("user", "said", text) if triple else Fact(text)
    # A model that would delete anything it is shown is not even asked about a duplicate.
    asked = []
    deleter = ModelDecider(scripted({"": "DELETE 1"}, asked))
    with tempfile.TemporaryDirectory() as root:
        store = MemoryStore(root, clock=Clock())
        updater = MemoryUpdater(store, embed, decider=deleter)
        first = updater.add(fact, user="u")
        asked.clear()
        again = updater.add(fact, user="u")
        assert (first.action, again.action, again.target) == ("ADD", "NOOP", first.id)
        assert not asked
        [kept] = store.records(user="u", history=True)
        assert (kept.id, kept.valid_to, kept.expired_at) == (first.id, None, None)
        assert [d.action for d in decisions(store)] == ["ADD", "NOOP"]


def test_a_delete_is_an_invalidation_scoped_to_one_user(tmp_path):
    store = MemoryStore(tmp_path, clock=Clock())
    updater = MemoryUpdater(store, embed, extractor=FactExtractor(EXTRACT))
    cat = Fact.triple("Ann", "has", "a cat")
    ann, bob = updater.add(cat, user="ann"), updater.add(cat, user="bob")
    [gone] = updater.update("I gave the cat away", user="bob")
    assert (gone.action, gone.target) == ("DELETE", bob.id)
    assert store.get(bob.id).valid_to is not None and store.records(user="bob") == []
    assert [r.id for r in store.records(user="bob", history=True)] == [bob.id]  # still stored
    assert [r.id for r in store.records(user="ann")] == [ann.id]
    assert updater.add(Fact.triple("Ann", "has", "*", True), user="bob").action == "NOOP"
    # A decider naming another user's memory is refused when the decision is applied.
    rogue = MemoryUpdater(store, embed, decider=lambda fact, shown: Decision("DELETE", ann.id))
    refused = rogue.add(Fact.triple("Bob", "has", "a dog"), user="bob")
    assert refused.action == "NOOP" and "no longer a valid memory of bob" in refused.reason
    assert store.get(ann.id).valid_to is None
    # A model that would write a retraction as a fact deletes instead.
    told = MemoryUpdater(store, embed, decider=ModelDecider(scripted({"": "UPDATE 1"})))
    retracted = told.add(Fact.triple("Ann", "has", "a cat", True), user="ann")
    assert (retracted.action, retracted.target, retracted.id) == ("DELETE", ann.id, None)
    assert store.records(user="ann") == []


def test_new_notes_are_linked_both_ways_to_related_ones_with_keywords(tmp_path):
    store = MemoryStore(tmp_path, clock=Clock())
    linker = NoteLinker(threshold=0.5, generate=scripted({"": "Keywords: Tea, drinks, tea"}))
    updater = MemoryUpdater(store, embed, linker=linker)
    tea = updater.add("Ann drinks green tea every morning", user="ann")
    updater.add("Ann plays chess", user="ann")
    more = updater.add("Ann drinks green tea every evening", user="ann")
    assert (more.action, store.get(more.id).links) == ("ADD", (tea.id,))
    assert store.get(tea.id).links == (more.id,)
    assert store.get(more.id).metadata["keywords"] == ["tea", "drinks"]


def _record(text, importance, accessed_at, user="ann", **fields):
    return MemoryRecord(
        text=text,
        user=user,
        embedding=embed([text])[0],
        importance=importance,
        accessed_at=accessed_at,
        **fields,
    )


def test_reflection_runs_when_the_importance_since_the_last_one_reaches_the_threshold(tmp_path):
    clock = Clock()
    store = MemoryStore(tmp_path, clock=clock)
    calls = []
    answer = "1. Ann prefers hot drinks (because of 1, 3)\nAnn is busy\nWrong (because of 9)"
    reflector = Reflector(scripted({"insights": answer}, calls), threshold=20.0)
    texts = ["Ann ordered tea", "Ann read a book", "Ann ordered cocoa", "Ann went running"]
    ids = []
    for text in texts[:3]:
        ids += store.add(_record(text, 6.0, clock.t, type="episodic"))
        clock.t += 1
    assert reflector.maybe_reflect(store, "ann") == [] and not calls  # 18 < 20
    ids += store.add(_record(texts[3], 6.0, clock.t, type="episodic"))
    [insight] = reflector.maybe_reflect(store, "ann")  # 24 >= 20
    assert len(calls) == 1 and "1. Ann ordered tea" in calls[0]
    stored = store.get(insight)
    assert (stored.text, stored.type, stored.source) == (
        "Ann prefers hot drinks",
        "semantic",
        "reflection",
    )
    assert (stored.links, stored.importance) == ((ids[0], ids[2]), 6.0)
    assert decisions(store)[-1].action == "REFLECT"
    clock.t += 1
    assert reflector.maybe_reflect(store, "ann") == [] and len(calls) == 1  # nothing new


def test_tiers_pin_the_most_valuable_and_evict_the_lowest_importance_times_recency(tmp_path):
    clock = Clock()
    now = clock.t
    store = MemoryStore(tmp_path, clock=clock)
    store.add(
        [
            _record("Ann is allergic to nuts", 9.0, now),
            _record("Ann likes jazz", 5.0, now - 10 * HOUR),
            _record("Ann once visited Rome", 8.0, now - 500 * HOUR),
        ]
    )
    tiers = Tiers(hot=2, decay=0.995)
    records = store.records()
    expected = np.array([9.0, 5.0 * 0.995**10, 8.0 * 0.995**500])
    np.testing.assert_allclose(tiers.value(records, now), expected)
    context = ContextManager()
    context.pin("Call mum on Sunday")  # not a memory of the store: left alone
    working = WorkingMemory(context, user="ann")
    change = tiers.promote(store, working)
    assert change.evicted == [] and len(change.promoted) == 2
    assert context.pinned == ["Call mum on Sunday", "Ann is allergic to nuts", "Ann likes jazz"]
    [cheese] = store.add(_record("Ann loves cheese", 7.0, now))
    change = tiers.promote(store, working)
    assert (change.promoted, change.evicted) == ([cheese], [records[1].id])
    assert context.pinned == ["Call mum on Sunday", "Ann is allergic to nuts", "Ann loves cheese"]
    assert store.get(records[1].id).valid_to is None  # evicted to the warm tier, not forgotten


def test_cold_memories_are_replaced_by_a_summary_that_links_them(tmp_path):
    clock = Clock()
    store = MemoryStore(tmp_path, clock=clock)
    old = clock.t - 2000 * HOUR
    ids = store.add([_record(f"Ann bought bread on day {d}", 1.0, old + d) for d in range(5)])
    [keep] = store.add(_record("Ann's passport is in the drawer", 9.0, clock.t - 10 * HOUR))
    tiers = Tiers(cold_below=1.0, cold_after=1000.0, group=3)
    [first, second] = tiers.compress(store, "ann")
    assert store.get(first).links == tuple(ids[:3]) and store.get(second).links == tuple(ids[3:])
    assert store.get(first).text == "; ".join(f"Ann bought bread on day {d}" for d in range(3))
    valid = {r.id for r in store.records(user="ann")}
    assert valid == {keep, first, second}
    assert {r.id for r in store.records(user="ann", valid_at=clock.t - 1)} == {*ids, keep}
    assert [d.action for d in decisions(store)] == ["SUMMARISE"] * 2
    assert tiers.compress(store, "ann") == []


def _snapshot(store):
    records = [
        (*(str(v) for k, v in vars(r).items() if k != "embedding"), r.embedding.tobytes())
        for r in store.records(history=True)
    ]
    return (
        records,
        store.execute("SELECT * FROM decisions"),
        store.execute("SELECT * FROM settings"),
    )


def test_consolidation_merges_reflects_tiers_and_changes_nothing_when_run_again(tmp_path):
    clock = Clock()
    store = MemoryStore(tmp_path, clock=clock)
    old = clock.t - 3000 * HOUR
    store.add(
        [
            _record("Ann likes green tea", 4.0, old),
            _record("ann likes green tea", 6.0, clock.t),
            _record("Ann bought milk", 1.0, old),
            _record("Ann bought eggs", 1.0, old),
            _record("Ann bought eggs", 1.0, old, user="bob"),
            _record("Ann runs marathons", 9.0, clock.t, type="episodic"),
        ]
    )
    reflector = Reflector(
        scripted({"insights": "Ann is health-minded (because of 3)"}), threshold=10
    )
    tiers = Tiers(cold_below=2.0, cold_after=24.0)
    counts = consolidate(store, reflector=reflector, tiers=tiers)
    assert counts == {"users": 2, "merged": 1, "insights": 1, "summaries": 1}
    texts = sorted(r.text for r in store.records(user="ann"))
    assert texts == [
        "Ann bought milk; Ann bought eggs",
        "Ann is health-minded",
        "Ann likes green tea",
        "Ann runs marathons",
    ]
    [tea] = [r for r in store.records(user="ann") if r.text == "Ann likes green tea"]
    assert (tea.importance, tea.accessed_at) == (6.0, clock.t)  # merged: max of both
    before = _snapshot(store)
    assert consolidate(store, reflector=reflector, tiers=tiers) == {
        "users": 2,
        "merged": 0,
        "insights": 0,
        "summaries": 0,
    }
    assert _snapshot(store) == before


def test_consolidation_runs_as_a_gin_job(tmp_path, capsys):
    with MemoryStore(tmp_path, "ann", clock=Clock()) as store:
        store.add([_record("Ann likes tea", 3.0, 0.0), _record("ann likes TEA", 3.0, 0.0)])
    assert main(["train", "--gin_file", "memory_consolidate", "--workdir", str(tmp_path)]) == 0
    assert "merged=1" in capsys.readouterr().out
    with MemoryStore(tmp_path, "ann") as store:
        assert len(store.records()) == 1
        assert json.loads(store.execute("SELECT shown FROM decisions")[0][0])[0][1] > 0.95
