"""Graph memory: facts persisted in the memory store come back as the same graph, contradicted
facts are invalidated (not deleted), and as-of queries in world and store time see what held
and what was known then."""

import random

import pytest

from agentic_jax.memory import GraphMemory, MemoryStore
from agentic_jax.retrieval.graph import TripleGraph

FACTS = [
    ("Ann", "works at", "Acme"),
    ("Acme", "is based in", "Lyon"),
    ("Lyon", "is in", "France"),
    ("Ann", "has a sister", "Maya"),
    ("Maya", "lives in", "Oslo"),
    ("Bob", "works at", "Initech"),
]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_persisted_facts_reload_into_the_same_neighbourhoods(tmp_path):
    rng = random.Random(0)
    in_memory = TripleGraph()
    with MemoryStore(tmp_path, "graph") as store:
        memory = GraphMemory(store)
        for i, (s, r, o) in enumerate(FACTS):
            when = float(rng.randrange(1, 50))
            memory.add(s, r, o, user="u", source=f"rec{i}", valid_from=when)
            in_memory.add(s, r, o, source=f"rec{i}", valid_from=when)
        memory.add("Ann", "works at", "Acme", user="other")  # another user's facts stay apart
    with MemoryStore(tmp_path, "graph") as store:  # reopened: read back from the file
        reloaded = GraphMemory(store).graph(user="u")
    assert reloaded.triples == in_memory.triples
    for seed in ("Ann", "lyon", "Maya", "Bob"):
        for k in range(4):
            assert reloaded.neighbourhood([seed], k) == in_memory.neighbourhood([seed], k)
    assert [t.object for t in reloaded.neighbourhood(["Ann"], 2)] == [
        "Acme",
        "Maya",
        "Lyon",
        "Oslo",
    ]
    assert {t.source for t in reloaded.neighbourhood(["Ann"], 1)} == {"rec0", "rec3"}


def test_a_contradiction_is_invalidated_and_as_of_queries_see_history(tmp_path):
    clock = Clock()
    with MemoryStore(tmp_path, "graph", clock=clock) as store:
        memory = GraphMemory(store, functional=["Lives in"])
        first = memory.add("Ann", "lives in", "Paris", user="u", valid_from=10.0)
        assert memory.add("ann", "lives  in", "paris", user="u").action == "noop"
        memory.add("Ann", "likes", "tea", user="u", valid_from=10.0)
        memory.add("Ann", "likes", "jazz", user="u", valid_from=20.0)  # not functional: both
        clock.now = 200.0
        moved = memory.add("Ann", "lives in", "Berlin", user="u", valid_from=50.0)
        assert moved.action == "added" and moved.invalidated == (first.id,)

        def lives(**when):
            return [
                t.object
                for t in memory.neighbourhood(["Ann"], 1, user="u", **when)
                if t.relation == "lives in"
            ]

        assert lives() == ["Berlin"]  # now
        assert lives(at=30.0) == ["Paris"]  # the world in the past, as known now
        assert lives(at=60.0) == ["Berlin"]
        # What the store believed before it learnt of the move: Paris, still open-ended.
        assert lives(at=300.0, known_at=150.0) == ["Paris"]
        assert lives(known_at=50.0) == []  # nothing stored yet
        likes = {t.object for t in memory.neighbourhood(["Ann"], 1, user="u", at=30.0)}
        assert {"tea", "jazz"} <= likes
        # Nothing was deleted: the full history is there, Paris closed at the move.
        history = memory.facts(user="u")
        assert [
            (t.object, t.valid_from, t.valid_to) for t in history if t.relation == "lives in"
        ] == [
            ("Paris", 10.0, 50.0),
            ("Berlin", 50.0, None),
        ]
        # A fact learnt late (it began before the stored one) is closed where that one begins.
        late = memory.add("Ann", "lives in", "Rome", user="u", valid_from=5.0)
        assert late.invalidated == ()
        assert lives(at=7.0) == ["Rome"] and lives(at=12.0) == ["Paris"]
        with pytest.raises(ValueError, match="no longer valid"):
            memory.invalidate(first.id, 60.0)
        memory.invalidate(moved.id, 90.0)
        assert lives() == [] and lives(at=80.0) == ["Berlin"]
        with pytest.raises(KeyError):
            memory.invalidate(999, 1.0)
        with pytest.raises(ValueError, match="needs a subject"):
            memory.add(" ", "lives in", "x", user="u")
