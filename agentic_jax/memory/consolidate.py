"""Sleep-time consolidation: the memory's housekeeping, run offline between sessions.

**Why offline** (Lin, Snell, Wang, Packer, Wooders, Stoica & Gonzalez 2025, *Sleep-time
Compute: Beyond Inference Scaling at Test-time*, arXiv:2504.13171).  Work that does not depend
on the next query (merging duplicates, drawing insights, compressing old memories) need not
be paid for while a user waits: done while the agent is idle, it makes later answers cheaper
and better.  :func:`consolidate` runs, for each user of a store,

1. **dedup-merge** (:func:`merge_duplicates`): the valid memories of one type whose embeddings
   have a cosine of at least ``duplicate`` are merged into the oldest (the higher importance,
   the latest access, links united and the duplicate's id added); the duplicate is invalidated,
   not deleted.  Greedy, oldest first, so the memories kept are pairwise below the threshold;
2. **reflection** (:class:`~agentic_jax.memory.reflection.Reflector`, when given);
3. **tiering** (:meth:`~agentic_jax.memory.tiers.Tiers.compress`, when given): cold groups
   replaced by summaries;
4. **dedup-merge** again, over what steps 2 and 3 wrote.

**Idempotent and resumable.**  Every step reads what it must do from the store (the memories
still valid, the reflection mark, the ages) and writes each unit of work (one merge, one
reflection, one summary) in one transaction with its log entry, so a run killed at any point
is finished by the next, and a second run right after a complete one changes nothing: the
memories kept are pairwise distinct, nothing is pending reflection (derived notes do not
count), and fresh summaries are not cold.  Every change is logged in the ``decisions`` table
(``MERGE``, ``REFLECT``, ``SUMMARISE``).

:func:`consolidation_job` is the same as a job of ``agentic-jax train`` over every space in a
directory: ``agentic-jax train --gin_file memory_consolidate --workdir runs/memory``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gin
import numpy as np

from agentic_jax.memory.decisions import log_decision
from agentic_jax.memory.records import STORED_TYPES
from agentic_jax.memory.reflection import Reflector
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.tiers import Tiers


def merge_duplicates(
    store: MemoryStore,
    user: str,
    *,
    threshold: float = 0.95,
    types: Sequence[str] = STORED_TYPES,
) -> int:
    """Merges ``user``'s valid near-duplicate memories (module docstring, step 1); how many
    were merged away."""
    merged = 0
    for kind in types:
        kept, units = [], []
        for record in store.records(user=user, types=[kind]):
            if record.embedding is None:
                continue
            unit = record.embedding / max(float(np.linalg.norm(record.embedding)), 1e-12)
            similarity = np.array(units) @ unit if units else np.array([])
            if not len(similarity) or similarity.max() < threshold:
                kept.append(record)
                units.append(unit)
                continue
            best = int(np.argmax(similarity))
            into = kept[best]  # as merged so far
            with store.transaction():
                store.invalidate(record.id, store.clock())
                kept[best] = store.update(
                    into.id,
                    user=user,
                    importance=max(into.importance, record.importance),
                    accessed_at=max(into.accessed_at, record.accessed_at),
                    links=tuple(dict.fromkeys(into.links + record.links + (record.id,))),
                    metadata={**record.metadata, **into.metadata},
                )
                log_decision(
                    store,
                    user=user,
                    action="MERGE",
                    text=record.text,
                    shown=[(into.id, float(similarity[best]))],
                    target=record.id,
                    result=into.id,
                    reason=f"cosine {similarity[best]:.3f} >= {threshold:g}",
                    decider="merge_duplicates",
                )
            merged += 1
    return merged


@gin.configurable(module="memory")
def consolidate(
    store: MemoryStore,
    *,
    users: Sequence[str] | None = None,
    duplicate: float | None = 0.95,
    reflector: Reflector | None = None,
    tiers: Tiers | None = None,
) -> dict[str, int]:
    """One sleep-time pass over ``store`` (module docstring) for ``users`` (default: every
    user with memories); ``duplicate=None`` merges nothing.  The counts of what it did."""
    if users is None:
        users = [u for (u,) in store.execute("SELECT DISTINCT user FROM memories ORDER BY user")]
    counts = {"users": len(users), "merged": 0, "insights": 0, "summaries": 0}

    def merge(user):
        if duplicate is not None:
            counts["merged"] += merge_duplicates(store, user, threshold=duplicate)

    for user in users:
        merge(user)
        if reflector is not None:
            counts["insights"] += len(reflector.maybe_reflect(store, user))
        if tiers is not None:
            counts["summaries"] += len(tiers.compress(store, user))
        merge(user)
    return counts


@gin.configurable(module="memory")
def consolidation_job(workdir: str, *, spaces: Sequence[str] | None = None) -> dict:
    """Consolidates (:func:`consolidate`, configured by gin) the memory spaces ``spaces``
    stored in ``workdir`` (default: every ``<space>.db`` there); the counts summed, as
    floats (what ``agentic-jax train`` prints)."""
    names = sorted(p.stem for p in Path(workdir).glob("*.db")) if spaces is None else spaces
    totals = {"spaces": float(len(names))}
    for name in names:
        with MemoryStore(workdir, name) as store:
            for key, count in consolidate(store).items():
                totals[key] = totals.get(key, 0.0) + count
    return totals
