"""A graph of facts: ``(subject, relation, object)`` triples, each remembering the chunk it was
read from and, optionally, when it holds.

Graph RAG (Edge et al. 2024, *From Local to Global: A Graph RAG Approach to Query-Focused
Summarization*, arXiv:2404.16130) reads entities and relations out of the chunks and answers
from the neighbourhood of the question's entities: facts two hops apart ("A founded B", "B is
based in C") come back together although no single chunk, and so no similarity search, holds
both.  The graph here is that index, and an agent's memory of facts can share it: a fact may
carry ``valid_from`` / ``valid_to`` (any ordered values: timestamps, dates), and a query at a
time sees only the facts valid then.

Entities are matched by their normal form (Unicode NFKC, case-folded, runs of whitespace as one
space), so "Ring attention" and "ring  attention" are one node; the first spelling met names it.
Everything comes back in a fixed order (insertion, breadth first), so a prompt built from the
graph is the same on every run.  Plain dicts: a few thousand facts need no graph library.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from typing import Any, NamedTuple

# One fact a line: (subject | relation | object), a list marker before it allowed.
_TRIPLE_LINE = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*\(([^|()]+)\|([^|()]+)\|([^|()]+)\)\s*\.?\s*$")


class Triple(NamedTuple):
    """A fact: ``subject --relation--> object``, read from chunk ``source``, holding from
    ``valid_from`` (inclusive) to ``valid_to`` (exclusive); ``None`` is unbounded or unknown."""

    subject: str
    relation: str
    object: str
    source: str | None = None
    valid_from: Any = None
    valid_to: Any = None

    def valid_at(self, time: Any) -> bool:
        return (self.valid_from is None or self.valid_from <= time) and (
            self.valid_to is None or time < self.valid_to
        )

    def line(self) -> str:
        """The fact in the line format :func:`parse_triples` reads."""
        return f"({self.subject} | {self.relation} | {self.object})"


def normal_form(name: str) -> str:
    """The key an entity is matched by: NFKC, case-folded, whitespace collapsed."""
    return " ".join(unicodedata.normalize("NFKC", name).casefold().split())


def parse_triples(text: str) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The ``(subject | relation | object)`` lines of ``text`` and the non-blank lines that are
    not one (so a caller can record what a model wrote wrong instead of losing it silently).  A
    line with an empty part is rejected too."""
    triples, rejected = [], []
    for line in text.splitlines():
        match = _TRIPLE_LINE.match(line)
        parts = tuple(" ".join(p.split()) for p in match.groups()) if match else ()
        if parts and all(parts):
            triples.append(parts)
        elif line.strip():
            rejected.append(line.strip())
    return triples, rejected


class TripleGraph:
    """Triples indexed by entity: :meth:`add` them, find an entity (:meth:`lookup`, or every one
    a text mentions, :meth:`mentions`), and take the :meth:`neighbourhood` ``k`` hops around some
    (edges followed in both directions: a question about B wants "A founded B" too)."""

    def __init__(self, triples: Iterable[Triple] = ()):
        self.triples: list[Triple] = []
        self._seen: set[Triple] = set()
        self._names: dict[str, str] = {}  # normal form -> first spelling
        self._edges: dict[str, list[int]] = {}  # normal form -> indices of its triples
        # chunks read: facts were added from them, or they were marked read holding none
        self.sources: set[str] = set()
        for triple in triples:
            self.add(*triple)

    def __len__(self) -> int:
        return len(self.triples)

    def add(
        self,
        subject: str,
        relation: str,
        object: str,
        source: str | None = None,
        valid_from: Any = None,
        valid_to: Any = None,
    ) -> Triple:
        """Adds a fact (again: a no-op) and returns it, its entities spelt as first met."""
        keys = normal_form(subject), normal_form(object)
        if not all(keys) or not relation.strip():
            raise ValueError(
                f"a triple needs a subject, relation and object: {subject!r}, "
                f"{relation!r}, {object!r}"
            )
        for key, name in zip(keys, (subject, object)):
            self._names.setdefault(key, " ".join(name.split()))
        triple = Triple(
            self._names[keys[0]],
            relation.strip(),
            self._names[keys[1]],
            source,
            valid_from,
            valid_to,
        )
        if triple not in self._seen:
            self._seen.add(triple)
            index = len(self.triples)
            self.triples.append(triple)
            for key in dict.fromkeys(keys):
                self._edges.setdefault(key, []).append(index)
            if source is not None:
                self.sources.add(source)
        return triple

    def entities(self) -> list[str]:
        """Every entity, as first spelt, in the order met."""
        return list(self._names.values())

    def lookup(self, name: str) -> str | None:
        """The entity ``name`` denotes (as first spelt), or ``None``."""
        return self._names.get(normal_form(name))

    def mentions(self, text: str) -> list[str]:
        """The entities ``text`` names as whole words, longest first where they overlap ("ring
        attention" over "attention"), in the order they occur."""
        folded = normal_form(text)
        taken: list[tuple[int, int, str]] = []
        for key in sorted(self._names, key=lambda k: (-len(k), k)):
            for m in re.finditer(rf"(?<!\w){re.escape(key)}(?!\w)", folded):
                if all(m.end() <= s or m.start() >= e for s, e, _ in taken):
                    taken.append((m.start(), m.end(), self._names[key]))
        return list(dict.fromkeys(name for _, _, name in sorted(taken)))

    def distances(self, seeds: Iterable[str], k: int, at: Any = None) -> dict[str, int]:
        """Breadth-first hop counts (up to ``k``) from the ``seeds`` entities known to the graph,
        over the facts valid ``at`` (every fact when ``None``); in order of discovery."""
        if k < 0:
            raise ValueError(f"k must be at least 0, got {k}")
        frontier = [key for key in dict.fromkeys(map(normal_form, seeds)) if key in self._names]
        distance = dict.fromkeys(frontier, 0)
        for hop in range(1, k + 1):
            nxt = []
            for key in frontier:
                for index in self._edges[key]:
                    triple = self.triples[index]
                    if at is not None and not triple.valid_at(at):
                        continue
                    for end in (normal_form(triple.subject), normal_form(triple.object)):
                        if end not in distance:
                            distance[end] = hop
                            nxt.append(end)
            frontier = nxt
        return {self._names[key]: d for key, d in distance.items()}

    def neighbourhood(self, seeds: Iterable[str], k: int, at: Any = None) -> list[Triple]:
        """The facts (valid ``at``) within ``k`` hops of ``seeds``: those with an end at most
        ``k - 1`` hops away, so ``k = 1`` is the facts about the seeds themselves.  Ordered by
        that nearer end's hop count, then as added."""
        near = self.distances(seeds, k - 1, at) if k > 0 else {}
        hops: dict[int, int] = {}
        for name, d in near.items():
            for index in self._edges[normal_form(name)]:
                if at is None or self.triples[index].valid_at(at):
                    hops[index] = min(hops.get(index, d), d)
        return [self.triples[i] for i in sorted(hops, key=lambda i: (hops[i], i))]
