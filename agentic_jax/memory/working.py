"""Working memory: what the context window holds now, seen as memory records.

Working memory is not a second store (CoALA, Sumers et al. 2023: it is the model's current
input).  In this project the context window is built by the agents' ``ContextManager``
(``agents.context.manager``): its pinned facts, repeated verbatim after every compaction, and
the running summary of older turns.  :class:`WorkingMemory` reads those as ``working`` records
and pins records recalled from a store into the window, so the read policy's results reach the
model through the manager's own mechanism, inside its token budget.  It depends only on the
manager's shape (:class:`Context`), as the agents package sits above this one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from agentic_jax.memory.records import MemoryRecord


class Context(Protocol):
    """What working memory needs of a context manager (``agents.context.ContextManager``)."""

    pinned: list[str]
    summary: str | None

    def pin(self, *facts: str) -> None: ...


class WorkingMemory:
    """The working memory of ``user``: a view of ``context``, holding nothing itself."""

    def __init__(self, context: Context, *, user: str):
        self.context, self.user = context, user

    def records(self) -> list[MemoryRecord]:
        """The pinned facts, then the summary of earlier turns, as working records (the
        ``source`` says which)."""
        held = [(fact, "pinned") for fact in self.context.pinned]
        if self.context.summary:
            held.append((self.context.summary, "summary"))
        return [
            MemoryRecord(text=text, user=self.user, type="working", source=source)
            for text, source in held
        ]

    def hold(self, records: Iterable[MemoryRecord]) -> None:
        """Pins the records' texts into the window (kept verbatim by every compaction)."""
        self.context.pin(*(r.text for r in records))

    def release(self, records: Iterable[MemoryRecord]) -> None:
        """Unpins the records' texts (the hot tier evicting them: they stay in the store)."""
        texts = {r.text for r in records}
        self.context.pinned[:] = [f for f in self.context.pinned if f not in texts]
