"""Memory records: the four kinds of memory of a language agent and the fields each carries.

The kinds are CoALA's (Sumers, Yao, Narasimhan & Griffiths 2023, *Cognitive Architectures for
Language Agents*), after the cognitive-science division of memory:

- **working**: what the agent holds in mind now, i.e. the context window's contents.  It is
  not stored: :class:`~agentic_jax.memory.working.WorkingMemory` is a view of the context
  manager, and a store refuses working records;
- **episodic**: events the agent lived through, with when they happened (``event_time``) and
  how they ended (``outcome``), the material of Reflexion-style lessons and of reflection;
- **semantic**: facts about the world or the user, with where they came from (``provenance``)
  and how sure the agent is of them (``confidence`` in [0, 1]);
- **procedural**: how to do things: a successful ``tools`` sequence and the ``skill`` it
  belongs to, a name in the skills registry (``agents.protocols.skills``), so that a procedure
  learnt from experience and a skill written by hand are one thing.

Every record has an importance (Park et al. 2023's poignancy, 1 to 10 by the write policy),
creation and last-access times, a source, links to other records (A-MEM's notes, Xu et al.
2025), free metadata, and two time intervals (bi-temporal, as in temporal databases and Zep's
knowledge graph, Rasmussen et al. 2025): ``[valid_from, valid_to)`` in the world, when the fact
held (``None`` is unbounded), and ``[created_at, expired_at)`` in the store, when the store
believed it.  A contradicted fact is *invalidated* (its ``valid_to`` closed, ``expired_at``
stamped), never deleted, so what was true, and what the agent believed, at any past time stays
queryable.  Times are seconds (Unix time by default; any monotone clock works).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from typing import Any

import numpy as np

TYPES = ("working", "episodic", "semantic", "procedural")
STORED_TYPES = TYPES[1:]
# The fields only one kind of memory has; the others must leave them empty.
TYPE_FIELDS = {
    "episodic": ("event_time", "outcome"),
    "semantic": ("provenance", "confidence"),
    "procedural": ("tools", "skill"),
}


def new_id() -> str:
    return uuid.uuid4().hex


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryRecord:
    """One memory (see the module docstring).  ``id`` is generated when not given; ``space``,
    ``created_at`` and ``accessed_at`` are set by the store when left empty; ``importance``
    by the write policy.  ``embedding`` is a float32 vector of the store's dimension, or
    ``None`` for a record that only text search can find."""

    text: str
    user: str
    type: str = "semantic"
    id: str = dataclasses.field(default_factory=new_id)
    space: str = ""
    embedding: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    importance: float | None = None
    created_at: float | None = None
    accessed_at: float | None = None
    source: str = ""
    links: tuple[str, ...] = ()
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    event_time: float | None = None
    outcome: str | None = None
    provenance: str | None = None
    confidence: float | None = None
    tools: tuple[str, ...] = ()
    skill: str | None = None
    valid_from: float | None = None
    valid_to: float | None = None
    expired_at: float | None = None

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"memory type must be one of {TYPES}, got {self.type!r}")
        if not isinstance(self.text, str) or not self.text.strip():
            raise ValueError("a memory needs text")
        if not isinstance(self.user, str) or not self.user:
            raise ValueError("a memory belongs to a user (a non-empty string)")
        for name in ("links", "tools"):
            value = getattr(self, name)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{name} must be a sequence of strings, got {value!r}")
            object.__setattr__(self, name, tuple(value))
        for kind, fields in TYPE_FIELDS.items():
            if kind != self.type:
                for name in fields:
                    if getattr(self, name) not in (None, ()):
                        raise ValueError(f"{name} belongs to {kind} memories, not {self.type}")
        if self.type == "procedural" and not self.tools:
            raise ValueError("a procedural memory needs its tool sequence")
        if self.confidence is not None and not 0 <= self.confidence <= 1:
            raise ValueError(f"confidence must be in [0, 1], got {self.confidence}")
        if (
            self.valid_from is not None
            and self.valid_to is not None
            and self.valid_to < self.valid_from
        ):
            raise ValueError(f"valid_to {self.valid_to} precedes valid_from {self.valid_from}")
        if self.embedding is not None:
            embedding = np.asarray(self.embedding, np.float32)
            if embedding.ndim != 1 or not np.all(np.isfinite(embedding)):
                raise ValueError("an embedding is one finite vector")
            object.__setattr__(self, "embedding", embedding)
        object.__setattr__(self, "metadata", dict(self.metadata))
