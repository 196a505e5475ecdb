"""Graph memory: an agent's facts as entity-relation triples with time, kept in the memory
store and read back as Graph RAG's :class:`~agentic_jax.retrieval.graph.TripleGraph`.

**Why a graph.**  A similarity search returns memories that look like the question; a question
whose answer is two facts apart ("where is the company I work for based?": "I work at Acme",
"Acme is based in Lyon") needs the second fact, which does not look like the question.  Graph
memory (Mem0's graph variant, Chhikara et al. 2025; Zep's temporal knowledge graph, Rasmussen et
al. 2025) stores facts as ``(subject, relation, object)`` edges and answers from the ``k``-hop
neighbourhood of the entities a question names.  The neighbourhood search is Graph RAG's (Edge
et al. 2024): :meth:`GraphMemory.graph` loads a user's facts into the same
:class:`~agentic_jax.retrieval.graph.TripleGraph` that ``agents.rag.graph_rag`` indexes chunks
into, so one graph serves a RAG pipeline and an agent's memory alike; a fact's ``source`` is the
id of the memory record it was read from.

**Time, both kinds** (bi-temporal, as the records of :mod:`agentic_jax.memory.records`): a fact
holds in the world during ``[valid_from, valid_to)`` and was believed by the store during
``[created_at, expired_at)``.  A contradicted fact is *invalidated*, never deleted: its
``valid_to`` is closed and its ``expired_at`` stamped, so "where did Ann live in March?" and
"what did the agent believe on Monday?" stay answerable.  Contradiction is decided by the
relation's cardinality, as a knowledge base's single-value constraint (Wikidata's, say): a
relation named in ``functional`` ("lives in", "works at") holds one object per subject at a
time, so a new object ends the old one's validity where the new one's begins (Zep's edge
invalidation, with the decision made by the schema rather than by a model).  A fact that
arrives late, beginning before one already stored, is itself closed where the first such one
begins.  Adding a fact that is already valid is a no-op.

Facts live in the store's ``triples`` table (migration 4 of :data:`~agentic_jax.memory.store.
MIGRATIONS`), in the same file and transactions as the records, so a crash loses at most the
write in flight.  Entities are matched by :func:`~agentic_jax.retrieval.graph.normal_form`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import gin

from agentic_jax.memory.store import MemoryStore
from agentic_jax.retrieval.graph import Triple, TripleGraph, normal_form


class GraphWrite(NamedTuple):
    """What :meth:`GraphMemory.add` did: ``action`` is ``added`` or ``noop`` (the fact was
    already valid: ``id`` is the stored one); ``invalidated``: the ids of facts it ended."""

    action: str
    id: int
    invalidated: tuple[int, ...] = ()


_COLUMNS = "subject, relation, object, source, valid_from"


@gin.configurable(module="memory")
class GraphMemory:
    """The facts of ``store``'s users as triples (see the module docstring).  ``functional``:
    the relations (matched by normal form) that hold one object per subject at a time."""

    def __init__(self, store: MemoryStore, *, functional: Iterable[str] = ()):
        self.store = store
        self.functional = {normal_form(r) for r in functional}

    def add(
        self,
        subject: str,
        relation: str,
        object: str,
        *,
        user: str,
        source: str | None = None,
        valid_from: float | None = None,
        valid_to: float | None = None,
        now: float | None = None,
    ) -> GraphWrite:
        """Stores ``user``'s fact ``subject --relation--> object`` read from record ``source``,
        valid from ``valid_from`` (default: ``now``, the store's clock) to ``valid_to``; a
        functional relation's other valid objects for this subject are invalidated where it
        begins."""
        keys = normal_form(subject), normal_form(relation), normal_form(object)
        if not all(keys):
            raise ValueError(f"a fact needs a subject, relation and object: {keys}")
        now = self.store.clock() if now is None else now
        start = now if valid_from is None else valid_from
        with self.store.transaction():
            rows = self.store.execute(
                "SELECT id, object_key, valid_from, valid_to IS NULL AND expired_at IS NULL "
                "FROM triples WHERE user = ? AND subject_key = ? AND relation_key = ? ORDER BY id",
                (user, *keys[:2]),
            )
            same = [i for i, key, _, current in rows if current and key == keys[2]]
            if same:
                return GraphWrite("noop", same[0])
            ended = []
            if keys[1] in self.functional:
                # A late fact (another began after it) ends where the first of those begins.
                later = [began for _, _, began, _ in rows if began is not None and began > start]
                if later:
                    valid_to = min(later) if valid_to is None else min(valid_to, *later)
                for id, _, began, current in rows:
                    if current and (began is None or began <= start):
                        self.invalidate(id, start, now=now)
                        ended.append(id)
            self.store.execute(
                "INSERT INTO triples (user, subject, relation, object, subject_key, "
                "relation_key, object_key, source, valid_from, valid_to, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    user,
                    " ".join(subject.split()),
                    " ".join(relation.split()),
                    " ".join(object.split()),
                    *keys,
                    source,
                    start,
                    valid_to,
                    now,
                ),
            )
            (id,) = self.store.execute("SELECT last_insert_rowid()")[0]
        return GraphWrite("added", id, tuple(ended))

    def invalidate(self, id: int, at: float, *, now: float | None = None) -> None:
        """Fact ``id`` stopped holding at world time ``at``; the store learnt it at ``now``."""
        now = self.store.clock() if now is None else now
        with self.store.transaction():
            rows = self.store.execute(
                "SELECT valid_from, valid_to FROM triples WHERE id = ?", (id,)
            )
            if not rows:
                raise KeyError(f"no fact {id} in space {self.store.space!r}")
            began, ended = rows[0]
            if ended is not None:
                raise ValueError(f"fact {id} is no longer valid since {ended}")
            if began is not None and at < began:
                raise ValueError(f"fact {id} cannot end at {at}, before it began ({began})")
            self.store.execute(
                "UPDATE triples SET valid_to = ?, expired_at = ? WHERE id = ?", (at, now, id)
            )

    def facts(self, *, user: str, known_at: float | None = None) -> list[Triple]:
        """Every fact of ``user`` the store held at store time ``known_at`` (default: now), in
        the order stored, each with its validity as known then (an invalidation stamped later
        is not yet known: the fact was still open-ended)."""
        known = self.store.clock() if known_at is None else known_at
        rows = self.store.execute(
            f"SELECT {_COLUMNS}, CASE WHEN expired_at > ? THEN NULL ELSE valid_to END "
            "FROM triples WHERE user = ? AND created_at <= ? ORDER BY id",
            (known, user, known),
        )
        return [Triple(*row) for row in rows]

    def graph(self, *, user: str, known_at: float | None = None) -> TripleGraph:
        """``user``'s facts as known at ``known_at`` in a :class:`TripleGraph` (Graph RAG's
        index: ``agents.rag.build_graph_rag(graph=...)`` answers from it); its ``at=``
        arguments then select a world time."""
        return TripleGraph(self.facts(user=user, known_at=known_at))

    def neighbourhood(
        self,
        seeds: Sequence[str],
        k: int,
        *,
        user: str,
        at: float | None = None,
        known_at: float | None = None,
    ) -> list[Triple]:
        """The facts within ``k`` hops of the ``seeds`` entities that held at world time ``at``
        as the store knew them at ``known_at`` (both default: now)."""
        at = self.store.clock() if at is None else at
        return self.graph(user=user, known_at=known_at).neighbourhood(seeds, k, at=at)
