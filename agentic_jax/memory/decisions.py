"""The decisions log: every change the memory makes to itself, with its inputs and reason.

An agent's memory rewrites itself (Mem0's updates, consolidation's merges, reflections and
summaries: :mod:`agentic_jax.memory.update`, :mod:`agentic_jax.memory.consolidate`); a log of
why each memory was added, replaced, invalidated or derived is what lets a person audit it and
a developer debug a decider.  It is the store's ``decisions`` table (migration 6), written in
the same transaction as the change it records, so the log and the memories never disagree.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from agentic_jax.memory.store import MemoryStore


class LoggedDecision(NamedTuple):
    """A row of the decisions log: ``shown`` is the memories shown to the decider, ``[id,
    cosine]`` pairs (a derived note's sources, with cosine ``None``); ``target`` the memory
    acted on and ``result`` the one written."""

    seq: int
    time: float
    user: str
    action: str
    text: str
    shown: list
    target: str | None
    result: str | None
    reason: str
    decider: str


def log_decision(
    store: MemoryStore,
    *,
    user: str,
    action: str,
    text: str,
    shown: Sequence[tuple[str, float | None]] = (),
    target: str | None = None,
    result: str | None = None,
    reason: str = "",
    decider: str = "",
) -> None:
    """Appends a decision to ``store``'s log (in the caller's transaction, if any), at the
    store's clock."""
    with store.transaction():
        store.execute(
            "INSERT INTO decisions (time, user, action, text, shown, target, result, reason, "
            "decider) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                store.clock(),
                user,
                action,
                text,
                json.dumps([list(pair) for pair in shown]),
                target,
                result,
                reason,
                decider,
            ),
        )


def decisions(store: MemoryStore, *, user: str | None = None) -> list[LoggedDecision]:
    """The decisions logged in ``store`` (of ``user``), in order."""
    where, params = ("WHERE user = ?", (user,)) if user is not None else ("", ())
    rows = store.execute(
        f"SELECT seq, time, user, action, text, shown, target, result, reason, decider "
        f"FROM decisions {where} ORDER BY seq",
        params,
    )
    return [LoggedDecision(*r[:5], json.loads(r[5]), *r[6:]) for r in rows]
