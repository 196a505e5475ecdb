"""Links between notes: each new memory is linked to the related memories already stored.

**A-MEM** (Xu, Liang, Mei, Gao, Tan & Zhang 2025, *A-MEM: Agentic Memory for LLM Agents*,
arXiv:2502.12110) organises memory as a Zettelkasten: every note, when written, is linked to
its nearest related notes, and may carry generated keywords and tags.  A read that finds one
note can then follow its links to notes that do not look like the query but belong with it
(the box of a Zettelkasten), and consolidation can see which notes form a group.

:class:`NoteLinker` does the linking at insertion, in the same store transaction: the ``k``
nearest valid memories of the same user with a cosine similarity of at least ``threshold``
are linked both ways (the new note's ``links`` name them, and each of theirs names it).  With a
``generate`` callable it also asks for keywords (``KEYWORDS: a, b, c``), kept in the note's
``metadata["keywords"]``; a reply without that line gives none and is logged.  Notes derived
from others (reflections, summaries) are linked to their sources by provenance instead, and
take the centroid of their sources' embeddings when no encoder is given
(:func:`insert_derived`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence

import gin
import numpy as np

from agentic_jax.memory.decisions import log_decision
from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.write import Embed

log = logging.getLogger(__name__)

KEYWORDS_PROMPT = (
    "Give up to {n} keywords that capture the topic of this memory note, most important "
    "first.\nNote: {text}\nAnswer with one line: KEYWORDS: keyword, keyword, ..."
)
_KEYWORDS = re.compile(r"^\W*keywords?\s*:\s*(.*)$", re.I | re.M)


def parse_keywords(reply: str) -> tuple[str, ...] | None:
    """The keywords of the first ``KEYWORDS:`` line of ``reply``, lower-cased and without
    repeats; ``None`` when there is no such line."""
    match = _KEYWORDS.search(reply)
    if match is None:
        return None
    words = (w.strip().strip(".").lower() for w in match.group(1).split(","))
    return tuple(dict.fromkeys(w for w in words if w))


@gin.configurable(module="memory")
class NoteLinker:
    """A-MEM's links (module docstring): a new note is linked both ways to its ``k`` nearest
    valid notes of the same user at cosine ``threshold`` or more; ``generate`` (optional, a
    ``prompt -> text`` callable) adds up to ``keywords`` keywords to its metadata."""

    def __init__(
        self,
        *,
        threshold: float = 0.8,
        k: int = 5,
        generate: Callable[[str], str] | None = None,
        keywords: int = 5,
        prompt: str = KEYWORDS_PROMPT,
    ):
        self.threshold, self.k, self.generate = threshold, k, generate
        self.keywords, self.prompt = keywords, prompt

    def annotate(self, record: MemoryRecord) -> MemoryRecord:
        """``record`` with generated keywords (unchanged without ``generate``)."""
        if self.generate is None:
            return record
        reply = self.generate(self.prompt.format(n=self.keywords, text=record.text))
        words = parse_keywords(reply)
        if words is None:
            log.warning("note keywords: no KEYWORDS line in %r", reply)
            return record
        metadata = {**record.metadata, "keywords": list(words[: self.keywords])}
        return dataclasses.replace(record, metadata=metadata)

    def insert(self, store: MemoryStore, record: MemoryRecord) -> str:
        """Stores ``record`` linked to its neighbours, and links them back, in one transaction;
        its id.  Annotate it first (:meth:`annotate`), outside the transaction: a model call
        should not hold the store's write lock."""
        with store.transaction():
            near = []
            if record.embedding is not None:
                found = store.search(record.embedding, self.k, user=record.user)
                near = [r for r, s in found if s >= self.threshold and r.id != record.id]
            links = tuple(dict.fromkeys(record.links + tuple(r.id for r in near)))
            store.add(dataclasses.replace(record, links=links))
            for other in near:
                if record.id not in other.links:
                    store.update(other.id, user=other.user, links=other.links + (record.id,))
        return record.id


def insert(store: MemoryStore, record: MemoryRecord, linker: NoteLinker | None) -> str:
    """Stores ``record``, through ``linker`` when there is one; its id."""
    if linker is None:
        return store.add(record)[0]
    return linker.insert(store, record)


def derived_embedding(
    text: str, sources: Sequence[MemoryRecord], embed: Embed | None
) -> np.ndarray | None:
    """The embedding of a note made from ``sources`` (a reflection, a summary): ``embed``'s of
    its text, or without an encoder the normalised mean of the sources' unit embeddings (what
    they share), or ``None`` when none has one."""
    if embed is not None:
        return np.asarray(embed([text]), np.float32)[0]
    vectors = [r.embedding for r in sources if r.embedding is not None]
    if not vectors:
        return None
    units = np.stack(vectors) / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    mean = units.mean(axis=0)
    return (mean / max(float(np.linalg.norm(mean)), 1e-12)).astype(np.float32)


def insert_derived(
    store: MemoryStore,
    text: str,
    sources: Sequence[MemoryRecord],
    *,
    user: str,
    action: str,
    reason: str,
    decider: str,
    embed: Embed | None = None,
    linker: NoteLinker | None = None,
    **fields,
) -> str:
    """Stores a note ``text`` of ``user`` derived from ``sources`` (a reflection, a summary;
    ``fields`` are its other record fields): linked to them, with their highest importance,
    embedded by ``embed`` or :func:`derived_embedding`, and logs ``action`` with the sources as
    its inputs, in one transaction (the caller's, if any); its id."""
    record = MemoryRecord(
        text=text,
        user=user,
        embedding=derived_embedding(text, sources, embed),
        importance=max(r.importance for r in sources),
        links=[r.id for r in sources],
        **fields,
    )
    if linker is not None:
        record = linker.annotate(record)
    with store.transaction():
        id = insert(store, record, linker)
        log_decision(
            store,
            user=user,
            action=action,
            text=text,
            shown=[(r.id, None) for r in sources],
            result=id,
            reason=reason,
            decider=decider,
        )
    return id
