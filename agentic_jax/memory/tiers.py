"""Hierarchical memory tiers: hot in the context window, warm in the store, cold summarised.

**Why tiers** (MemGPT: Packer et al. 2023, *MemGPT: Towards LLMs as Operating Systems*, its
main context, recall and archival storage; the memory hierarchy of an operating system).  The
context window is small and every token in it costs at every step, the store is large but
reached only by a search, and a store that keeps every old trivial memory verbatim makes that
search slower and noisier.  So memories move between three tiers by one score,

    value(m) = importance(m) · decay ** hours_since_access(m)

Park et al.'s (2023) importance and recency, multiplied: a memory is worth holding if it
matters and was used lately.

- **Hot** (:meth:`Tiers.promote`): the ``hot`` highest-valued valid memories of the user are
  pinned into the context window through :class:`~agentic_jax.memory.working.WorkingMemory`
  (the context manager keeps pinned facts verbatim through every compaction); a memory pinned
  earlier that fell out of the top is evicted (unpinned, and stays warm in the store).  Pins that
  are not memories of the store are left alone.
- **Warm**: the store, read by :class:`~agentic_jax.memory.read.MemoryReader`.
- **Cold** (:meth:`Tiers.compress`): valid memories whose value is below ``cold_below`` and
  that were not accessed for ``cold_after`` hours, oldest access first, are replaced in groups
  of ``group`` (of one type) by one summary each: the summary (``source="summary"``, links to
  the group, the group's highest importance, valid from now) is inserted and the group
  invalidated now, never deleted, so an as-of query of an earlier time finds the originals.
  The summary is ``generate``'s answer to ``prompt``, or without a model the texts joined
  (fewer records, nothing lost); a summary is fresh (accessed now), so it is not summarised
  again until it has aged in turn.
  Groups smaller than ``min_group`` are left warm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import gin
import numpy as np

from agentic_jax.memory.links import NoteLinker, insert_derived
from agentic_jax.memory.read import HOUR
from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.working import WorkingMemory
from agentic_jax.memory.write import Embed

SUMMARY_PROMPT = (
    "Summarise these memories of {user} in one or two sentences, keeping every name, date, "
    "number and preference they state:\n{memories}\nSummary:"
)


class TierChange(NamedTuple):
    """The ids :meth:`Tiers.promote` pinned into the window and those it evicted from it."""

    promoted: list[str]
    evicted: list[str]


@gin.configurable(module="memory")
class Tiers:
    """The three tiers of the module docstring for memories of ``types``.  ``decay`` is the
    recency per hour (Park et al.'s 0.995); ``generate`` (optional, ``prompt -> text``) writes
    summaries; ``embed`` embeds them (default: the group's centroid); ``linker`` links them to
    related notes besides their group."""

    def __init__(
        self,
        *,
        hot: int = 8,
        decay: float = 0.995,
        cold_below: float = 2.0,
        cold_after: float = 24.0 * 30,
        group: int = 8,
        min_group: int = 2,
        types: Sequence[str] = ("episodic", "semantic"),
        generate: Callable[[str], str] | None = None,
        embed: Embed | None = None,
        linker: NoteLinker | None = None,
        prompt: str = SUMMARY_PROMPT,
    ):
        if not 0 < decay <= 1:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        if cold_after <= 0:
            raise ValueError("cold_after must be positive (a fresh summary is not cold)")
        if not 2 <= min_group <= group:
            raise ValueError(f"need 2 <= min_group <= group, got {min_group}, {group}")
        self.hot, self.decay, self.cold_below, self.cold_after = hot, decay, cold_below, cold_after
        self.group, self.min_group, self.types = group, min_group, list(types)
        self.generate, self.embed, self.linker, self.prompt = generate, embed, linker, prompt

    def value(self, records: Sequence[MemoryRecord], now: float) -> np.ndarray:
        """``importance · decay ** hours since last access`` of each record."""
        hours = np.array([max(now - r.accessed_at, 0.0) / HOUR for r in records])
        return np.array([r.importance for r in records]) * self.decay**hours

    def promote(
        self, store: MemoryStore, working: WorkingMemory, *, now: float | None = None
    ) -> TierChange:
        """Pins the ``hot`` highest-valued valid memories of ``working.user`` into the window
        and unpins those of its memories that fell out (ties go to the older)."""
        now = store.clock() if now is None else now
        records = store.records(user=working.user, types=self.types, valid_at=now)
        order = np.argsort(-self.value(records, now), kind="stable") if records else []
        hot = [records[i] for i in order[: self.hot]]
        hot_texts = {r.text for r in hot}
        pinned = set(working.context.pinned)
        evicted = [r for r in records if r.text in pinned and r.text not in hot_texts]
        promoted = [r for r in hot if r.text not in pinned]
        working.release(evicted)
        working.hold(promoted)
        return TierChange([r.id for r in promoted], [r.id for r in evicted])

    def cold(self, store: MemoryStore, user: str, now: float) -> list[list[MemoryRecord]]:
        """The groups of ``user``'s memories due to be summarised at ``now``."""
        records = store.records(user=user, types=self.types, valid_at=now)
        due = [
            r
            for r, v in zip(records, self.value(records, now) if records else [])
            if v < self.cold_below and now - r.accessed_at >= self.cold_after * HOUR
        ]
        groups = []
        for kind in self.types:
            of_kind = sorted((r for r in due if r.type == kind), key=lambda r: r.accessed_at)
            chunks = (of_kind[i : i + self.group] for i in range(0, len(of_kind), self.group))
            groups += [c for c in chunks if len(c) >= self.min_group]
        return groups

    def summarise(self, user: str, group: Sequence[MemoryRecord]) -> str:
        texts = [r.text for r in group]
        if self.generate is not None:
            memories = "\n".join(f"- {t}" for t in texts)
            summary = self.generate(self.prompt.format(user=user, memories=memories)).strip()
            if summary:
                return summary
        return "; ".join(texts)

    def compress(self, store: MemoryStore, user: str, *, now: float | None = None) -> list[str]:
        """Replaces each cold group of ``user``'s memories by a summary (one transaction per
        group, logged as ``SUMMARISE``); the summaries' ids."""
        now = store.clock() if now is None else now
        ids = []
        for group in self.cold(store, user, now):
            text = self.summarise(user, group)
            with store.transaction():
                for r in group:
                    store.invalidate(r.id, now, now=now)
                summary = insert_derived(
                    store,
                    text,
                    group,
                    user=user,
                    action="SUMMARISE",
                    reason=f"value below {self.cold_below:g}, unused for {self.cold_after:g} h",
                    decider=type(self).__name__,
                    embed=self.embed,
                    linker=self.linker,
                    type=group[0].type,
                    source="summary",
                    metadata={"summarises": len(group)},
                    created_at=now,
                    valid_from=now,  # it takes over where the group's validity ends
                )
            ids.append(summary)
        return ids
