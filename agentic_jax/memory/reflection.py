"""Reflection: higher-level insights over recent memories, written back as semantic memory.

**Why** (Park, O'Brien, Cai, Morris, Liang & Bernstein 2023, *Generative Agents*, §4.2).
Observations alone let an agent recall what happened but not generalise ("Ann ordered tea
three times" is not "Ann prefers tea"); retrieval then finds many small facts where one
insight would serve.  Reflection periodically asks the model what the recent memories add up
to and stores the answers as memories of their own, which later reflections can build on.

**When.**  Reflection runs when the sum of the importance of the memories written since the
last reflection reaches ``threshold`` (the paper's is 150, "roughly two or three times a day"
for its agents).  Notes derived by the memory itself (reflections, and the tiers' summaries:
``source`` in :data:`DERIVED`) do not count toward it, as the paper sums the events perceived;
so a reflection cannot trigger itself, and a second consolidation right after the first
reflects nothing.  How far the last reflection reached (the newest creation time it covered)
is kept per user in the store's settings, in the same transaction as its insights: a
reflection is written whole or not at all, and a reflection interrupted by a crash simply runs
again.

**How.**  The ``window`` most recent memories (the paper's 100) are numbered and the generator
is asked the paper's question, "What 5 high-level insights can you infer from the above
statements? (example format: insight (because of 1, 5, 3))".  Each answer line in that format
becomes a semantic memory (``source="reflection"``) linked to the statements it cites (its
provenance), with their highest importance and, without an encoder, the centroid of their
embeddings; a line that does not cite statements shown is logged and dropped.  A reply with no
insight leaves the mark where it was, so the next consolidation asks again.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence

import gin

from agentic_jax.memory.links import NoteLinker, insert_derived
from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.write import Embed

log = logging.getLogger(__name__)

DERIVED = ("reflection", "summary")  # the sources of notes the memory wrote itself
REFLECTION_PROMPT = (
    "Statements about {user}:\n{statements}\n"
    "What {n} high-level insights can you infer from the above statements? "
    "Answer one per line in the format: insight (because of 1, 5, 3)"
)  # Park et al. 2023, §4.2 and appendix
_INSIGHT = re.compile(
    r"^\s*(?:[-*•]|\d+[.)])?\s*(?:insight\s*:\s*)?(.+?)\s*"
    r"\(\s*because\s+of\s+((?:\d+(?:\s*,\s*|\s+and\s+|\s*))+)\)\s*\.?\s*$",
    re.I,
)


def parse_insights(reply: str, count: int) -> tuple[list[tuple[str, list[int]]], list[str]]:
    """The ``(insight, statement indices from 0)`` of each line of ``reply`` in the format
    ``insight (because of 1, 5, 3)`` citing only statements 1..``count``, and the non-blank
    lines that are not one."""
    insights, rejected = [], []
    for line in reply.splitlines():
        match = _INSIGHT.match(line)
        cited = [int(n) - 1 for n in re.findall(r"\d+", match.group(2))] if match else []
        if cited and all(0 <= i < count for i in cited):
            insights.append((match.group(1).strip(), list(dict.fromkeys(cited))))
        elif line.strip():
            rejected.append(line.strip())
    return insights, rejected


@gin.configurable(module="memory")
class Reflector:
    """Park et al.'s reflection (module docstring): ``generate`` (``prompt -> text``) is asked
    ``prompt`` over the ``window`` most recent memories of ``types`` once their importance since
    the last reflection reaches ``threshold``, for up to ``insights`` insights.  ``embed``
    embeds an insight (default: its sources' centroid); ``linker`` links it to related notes
    (A-MEM) besides its sources."""

    def __init__(
        self,
        generate: Callable[[str], str],
        *,
        threshold: float = 150.0,
        window: int = 100,
        insights: int = 5,
        types: Sequence[str] = ("episodic", "semantic"),
        embed: Embed | None = None,
        linker: NoteLinker | None = None,
        prompt: str = REFLECTION_PROMPT,
    ):
        self.generate, self.threshold, self.window, self.insights = (
            generate,
            threshold,
            window,
            insights,
        )
        self.types, self.embed, self.linker, self.prompt = list(types), embed, linker, prompt

    @staticmethod
    def _mark_key(user: str) -> str:
        return f"reflected_until:{user}"

    def mark(self, store: MemoryStore, user: str) -> float:
        """The newest creation time the last reflection of ``user`` covered (``-inf``: none)."""
        rows = store.execute("SELECT value FROM settings WHERE key = ?", (self._mark_key(user),))
        return float(rows[0][0]) if rows else float("-inf")

    def pending(self, store: MemoryStore, user: str) -> list[MemoryRecord]:
        """``user``'s valid memories written since the last reflection, derived notes aside."""
        mark = self.mark(store, user)
        return [
            r
            for r in store.records(user=user, types=self.types)
            if r.created_at > mark and r.source not in DERIVED
        ]

    def maybe_reflect(self, store: MemoryStore, user: str) -> list[str]:
        """Reflects when the importance pending reaches the threshold; the insights' ids."""
        pending = self.pending(store, user)
        if sum(r.importance for r in pending) < self.threshold:
            return []
        return self.reflect(store, user, pending)

    def reflect(
        self, store: MemoryStore, user: str, pending: Sequence[MemoryRecord] | None = None
    ) -> list[str]:
        """Asks for insights over ``user``'s most recent memories now, stores them with the new
        mark (past ``pending``, default :meth:`pending`) and logs them; their ids."""
        pending = self.pending(store, user) if pending is None else pending
        recent = store.records(user=user, types=self.types)[-self.window :]
        if not recent:
            return []
        statements = "\n".join(f"{i}. {r.text}" for i, r in enumerate(recent, 1))
        reply = self.generate(self.prompt.format(user=user, statements=statements, n=self.insights))
        insights, rejected = parse_insights(reply, len(recent))
        for line in rejected:
            log.warning("reflection: dropped a line that is not an insight: %r", line)
        if not insights:
            return []
        ids = []
        reason = (
            f"importance {sum(r.importance for r in pending):g} since the last reflection "
            f"(threshold {self.threshold:g})"
        )
        with store.transaction():
            for text, cited in insights[: self.insights]:
                ids.append(
                    insert_derived(
                        store,
                        text,
                        [recent[i] for i in cited],
                        user=user,
                        action="REFLECT",
                        reason=reason,
                        decider=type(self).__name__,
                        embed=self.embed,
                        linker=self.linker,
                        source="reflection",
                        provenance="reflection",
                    )
                )
            covered = max([self.mark(store, user), *(r.created_at for r in pending)])
            store.execute(
                "INSERT OR REPLACE INTO settings VALUES (?, ?)",
                (self._mark_key(user), repr(covered)),
            )
        return ids
