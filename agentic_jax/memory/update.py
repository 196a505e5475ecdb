"""Memory updates: extract the facts of a turn, then decide, against the memories nearest each,
whether it is new, changes one, retracts one or is known already.

**Extract, then decide** (Mem0: Chhikara, Khant, Aryan, Singh & Yadav 2025, *Mem0: Building
Production-Ready AI Agents with Scalable Long-Term Memory*, arXiv:2504.19413).  Appending every
turn to memory fills it with repeats and stale facts ("Ann lives in Oslo" beside "Ann moved to
Lyon"), and a read then recalls both.  Mem0 splits the write in two phases:

1. **Extraction.**  A generator (``prompt -> text``) turns a conversation turn into candidate
   facts, one ``(subject | relation | object)`` line each, ``NOT (…)`` for one the turn says no
   longer holds, ``NONE`` for a turn with nothing worth keeping (:class:`FactExtractor`).  The
   format is strict so that it can be checked: a line that is not one is logged and dropped
   (never half-read into a wrong fact).  The triple lines are Graph RAG's
   (:func:`agentic_jax.retrieval.graph.parse_triples`), so the same extraction feeds graph
   memory too.
2. **Decision.**  For each fact the ``k`` nearest valid memories of the same user are shown to a
   decider, which answers ``ADD``, ``UPDATE <n>``, ``DELETE <n>`` or ``NOOP``: by rules
   (:class:`RuleDecider`, no model needed: a duplicate is a NOOP, the same subject and relation
   with another object an UPDATE, an explicit ``NOT`` a DELETE, anything else an ADD) or by a
   model (:class:`ModelDecider`; the memories are numbered 1..k in the prompt, as Mem0 maps
   its UUIDs to small integers, so a model cannot hallucinate an id; an unreadable answer falls
   back to the rules, and the fallback is logged).

**Applying a decision never deletes.**  ADD inserts; UPDATE *invalidates* the old memory at the
world time of the change (:meth:`MemoryStore.invalidate`: its ``valid_to`` closed, its
``expired_at`` stamped) and inserts the new one, linked both ways (``replaces`` in the new one's
metadata); DELETE invalidates too; NOOP does nothing.  So "where did Ann live in March?" stays
answerable by an as-of query (``store.records(valid_at=…)``), as in Zep's bi-temporal graph
(Rasmussen et al. 2025).  Both act only on the user's own valid memories: a target outside the
memories shown (another user's, one already invalidated) is refused.  **Adding a memory that is
already there is a NOOP**, whatever the decider: a fact equal to a shown memory (the same text
or triple up to case and spacing, or a cosine of at least ``duplicate``) is never sent to it,
so a model cannot turn a repeat into a delete.

**Every decision is logged** in the store's ``decisions`` table (migration 6, in the same file
and transaction as the change it made): the time, the user, the fact, the memories shown with
their similarities, the action, its target, the record written, the reason and the decider.
Consolidation (:mod:`agentic_jax.memory.consolidate`) logs its merges, reflections and
summaries there too.  New notes are linked to their neighbours (A-MEM,
:mod:`agentic_jax.memory.links`).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import gin

from agentic_jax.memory.decisions import log_decision
from agentic_jax.memory.links import NoteLinker, insert
from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore
from agentic_jax.memory.write import Embed, MemoryWriter
from agentic_jax.retrieval.graph import normal_form, parse_triples

log = logging.getLogger(__name__)

ACTIONS = ("ADD", "UPDATE", "DELETE", "NOOP")
Shown = Sequence[tuple[MemoryRecord, float]]  # the nearest memories and their cosines


@dataclasses.dataclass(frozen=True)
class Fact:
    """A candidate memory: a triple (``subject``, ``relation``, ``object``; its ``text`` the
    three joined) or free ``text``; ``negated``: the turn says it does not (or no longer)
    hold."""

    text: str
    subject: str | None = None
    relation: str | None = None
    object: str | None = None
    negated: bool = False

    @classmethod
    def triple(cls, subject: str, relation: str, object: str, negated: bool = False) -> Fact:
        return cls(f"{subject} {relation} {object}", subject, relation, object, negated)

    def line(self) -> str:
        """The fact in the extraction format."""
        triple = f"({self.subject} | {self.relation} | {self.object})"
        body = self.text if self.subject is None else triple
        return f"NOT {body}" if self.negated else body

    def map(self, fn: Callable[[str], str]) -> Fact:
        """The fact with ``fn`` applied to each of its texts (redaction)."""
        if self.subject is None:
            return dataclasses.replace(self, text=fn(self.text))
        return Fact.triple(fn(self.subject), fn(self.relation), fn(self.object), self.negated)

    def metadata(self) -> dict:
        """What a stored memory keeps of the triple, for later decisions."""
        if self.subject is None:
            return {}
        return {"subject": self.subject, "relation": self.relation, "object": self.object}


def _key(subject, relation) -> tuple[str, str] | None:
    return None if subject is None else (normal_form(subject), normal_form(relation))


def fact_key(fact: Fact) -> tuple[str, str] | None:
    """``(subject, relation)`` in normal form, ``None`` for free text."""
    return _key(fact.subject, fact.relation)


def record_key(record: MemoryRecord) -> tuple[str, str] | None:
    return _key(record.metadata.get("subject"), record.metadata.get("relation"))


def same_object(fact: Fact, record: MemoryRecord) -> bool:
    return normal_form(fact.object or "") == normal_form(str(record.metadata.get("object", "")))


_NOT = re.compile(r"^(\s*(?:[-*•]|\d+[.)])?\s*)NOT\s+", re.I)


def parse_facts(text: str) -> tuple[list[Fact], list[str]]:
    """The facts of an extractor's reply and its non-blank lines that are not one (``NONE``
    is no fact and no error)."""
    facts, rejected = [], []
    for line in text.splitlines():
        if not line.strip() or line.strip().upper() == "NONE":
            continue
        body, negated = _NOT.subn(r"\1", line)
        triples, _ = parse_triples(body)
        if triples:
            facts.append(Fact.triple(*triples[0], negated=bool(negated)))
        else:
            rejected.append(line.strip())
    return facts, rejected


EXTRACT_PROMPT = (
    "Extract the facts worth remembering about the user and their world from this conversation "
    "turn: preferences, plans, relationships, personal details, changes to earlier facts.\n"
    "Answer one fact per line as (subject | relation | object), for example "
    "(Ann | lives in | Lyon). Write NOT (subject | relation | object) for a fact the turn says "
    "is false or no longer holds. Answer NONE if there is nothing to remember.\n"
    "Turn:\n{turn}\nFacts:"
)


@gin.configurable(module="memory")
class FactExtractor:
    """Mem0's extraction phase: ``generate`` (``prompt -> text``; a policy becomes one by
    ``retrieval.as_generator``) asked ``prompt`` (formatted with ``turn``); its reply read by
    :func:`parse_facts`, the lines it cannot read logged as warnings and dropped."""

    def __init__(self, generate: Callable[[str], str], *, prompt: str = EXTRACT_PROMPT):
        self.generate, self.prompt = generate, prompt

    def __call__(self, turn: str) -> list[Fact]:
        facts, rejected = parse_facts(self.generate(self.prompt.format(turn=turn)))
        for line in rejected:
            log.warning("fact extraction: dropped a line that is not a fact: %r", line)
        return facts


class Decision(NamedTuple):
    """``action`` (one of :data:`ACTIONS`) on ``target``, the id of a memory shown (for UPDATE
    and DELETE; a NOOP names the memory that already says it), and why."""

    action: str
    target: str | None = None
    reason: str = ""


class Decider(Protocol):
    def __call__(self, fact: Fact, shown: Shown) -> Decision: ...


def duplicate_of(fact: Fact, shown: Shown, threshold: float) -> MemoryRecord | None:
    """The first shown memory that says ``fact`` already: the same text or triple up to case
    and spacing, or a cosine of at least ``threshold``.  A negated fact duplicates nothing."""
    if fact.negated:
        return None
    text, key = normal_form(fact.text), fact_key(fact)
    for record, similarity in shown:
        same_triple = key is not None and record_key(record) == key and same_object(fact, record)
        if normal_form(record.text) == text or same_triple or similarity >= threshold:
            return record
    return None


@gin.configurable(module="memory")
class RuleDecider:
    """The decision without a model, in this order: a duplicate (:func:`duplicate_of`) is a
    NOOP; a negated fact DELETEs the shown memory with its subject and relation (and its object,
    unless the fact's object is ``*``: "NOT (Ann | has | *)") and is a NOOP when there is none;
    a fact whose subject and relation a shown memory has with another object UPDATEs it, unless
    the relation is one of ``multi_valued`` (one likes many things); anything else is an ADD.
    Subjects, relations and objects are matched in normal form."""

    def __init__(self, *, duplicate: float = 0.95, multi_valued: Sequence[str] = ()):
        self.duplicate = duplicate
        self.multi_valued = {normal_form(r) for r in multi_valued}

    def __call__(self, fact: Fact, shown: Shown) -> Decision:
        known = duplicate_of(fact, shown, self.duplicate)
        if known is not None:
            return Decision("NOOP", known.id, "already known")
        key = fact_key(fact)
        same_key = [r for r, _ in shown if key is not None and record_key(r) == key]
        if fact.negated:
            for record in same_key:
                if fact.object == "*" or same_object(fact, record):
                    return Decision("DELETE", record.id, "the turn says it no longer holds")
            return Decision("NOOP", None, "nothing stored to retract")
        if same_key and key[1] not in self.multi_valued:
            return Decision("UPDATE", same_key[0].id, "same subject and relation, new object")
        return Decision("ADD", None, "new fact")


DECIDE_PROMPT = (
    "You manage a user's long-term memory. Compare a new fact with the stored memories most "
    "similar to it and decide what to do:\n"
    "ADD - the fact is new;\n"
    "UPDATE <n> - the fact changes memory <n>, which no longer holds (the fact replaces it);\n"
    "DELETE <n> - the fact says memory <n> no longer holds;\n"
    "NOOP - the memories already say it, or there is nothing to change.\n"
    "Stored memories:\n{memories}\nNew fact: {fact}\n"
    "Answer with one line: the decision, then ' -- ' and a short reason."
)
_DECISION = re.compile(
    r"^\W*(ADD|UPDATE|DELETE|NOOP)\b(?:\s*(?:memory\s*)?[#\[<]?(\d+)[\]>]?)?\W*(.*)$", re.I
)


def parse_decision(reply: str, shown: Shown) -> Decision | None:
    """The decision on the first non-blank line of ``reply``, its number mapped to the id of
    the memory shown there; ``None`` when there is none, or UPDATE or DELETE name no memory
    shown."""
    line = next((s for s in reply.splitlines() if s.strip()), "")
    match = _DECISION.match(line)
    if match is None:
        return None
    action, number, reason = match.group(1).upper(), match.group(2), match.group(3).strip()
    index = None if number is None else int(number) - 1
    target = shown[index][0].id if index is not None and 0 <= index < len(shown) else None
    if action in ("UPDATE", "DELETE") and target is None:
        return None
    return Decision(action, target if action != "ADD" else None, reason)


@gin.configurable(module="memory")
class ModelDecider:
    """Mem0's decision phase by a model: ``generate`` asked ``prompt`` (formatted with the
    numbered ``memories`` and the ``fact``), its reply read by :func:`parse_decision`; a reply
    it cannot read is logged and decided by ``fallback`` (the rules), the reason saying so."""

    def __init__(
        self,
        generate: Callable[[str], str],
        *,
        fallback: Decider | None = None,
        prompt: str = DECIDE_PROMPT,
    ):
        self.generate, self.prompt = generate, prompt
        self.fallback = RuleDecider() if fallback is None else fallback

    def __call__(self, fact: Fact, shown: Shown) -> Decision:
        memories = "\n".join(f"[{i}] {r.text}" for i, (r, _) in enumerate(shown, 1)) or "(none)"
        reply = self.generate(self.prompt.format(memories=memories, fact=fact.line()))
        decision = parse_decision(reply, shown)
        if decision is not None:
            return decision
        log.warning("memory decision: unreadable reply %r; deciding by the fallback", reply)
        action, target, reason = self.fallback(fact, shown)
        return Decision(action, target, f"fallback ({reason}): unreadable reply {reply[:200]!r}")


class UpdateResult(NamedTuple):
    """What :meth:`MemoryUpdater.add` did with ``fact``: ``action``, the memory it acted on
    (``target``) and the one it wrote (``id``, for ADD and UPDATE)."""

    fact: Fact
    action: str
    id: str | None
    target: str | None
    reason: str


@gin.configurable(module="memory")
class MemoryUpdater:
    """Mem0-style updates of ``store`` (see the module docstring).  ``embed`` maps texts to
    vectors; ``extractor`` reads facts from a turn (needed by :meth:`update` only);
    ``decider`` decides (default: the rules); ``writer`` redacts, embeds and scores a new
    memory (default: a :class:`MemoryWriter` over ``embed``); ``linker`` links it to its
    neighbours (``None``: no links); ``k`` memories are shown; a fact as close as ``duplicate``
    to one of them is a NOOP without asking the decider.  Facts are semantic memories."""

    def __init__(
        self,
        store: MemoryStore,
        embed: Embed,
        *,
        extractor: Callable[[str], list[Fact]] | None = None,
        decider: Decider | None = None,
        writer: MemoryWriter | None = None,
        linker: NoteLinker | None = None,
        k: int = 5,
        duplicate: float = 0.95,
    ):
        self.store, self.extractor, self.linker = store, extractor, linker
        self.decider = RuleDecider(duplicate=duplicate) if decider is None else decider
        self.writer = MemoryWriter(store, embed) if writer is None else writer
        self.k, self.duplicate = k, duplicate

    def update(
        self, turn: str, *, user: str, at: float | None = None, source: str = ""
    ) -> list[UpdateResult]:
        """Extracts the facts of ``turn`` and :meth:`add`-s each."""
        if self.extractor is None:
            raise ValueError("updating from a turn needs an extractor")
        return [self.add(f, user=user, at=at, source=source) for f in self.extractor(turn)]

    def add(
        self, fact: Fact | str, *, user: str, at: float | None = None, source: str = ""
    ) -> UpdateResult:
        """Decides what ``fact`` (a :class:`Fact` or a text) changes in ``user``'s memory at
        world time ``at`` (default: the store's clock), applies it and logs it.  The decider
        runs outside the store's write lock (a model may take seconds); the decision is applied
        in one transaction, and a target changed meanwhile is re-checked there.  A negated fact
        never writes a memory: a decider's UPDATE of it is a DELETE, its ADD a NOOP."""
        fact = Fact(fact) if isinstance(fact, str) else fact
        if self.writer.redact is not None:
            fact = fact.map(self.writer.redact)
        record = self.writer.prepare(
            MemoryRecord(
                text=fact.text,
                user=user,
                source=source,
                provenance=source or None,
                metadata=fact.metadata(),
            )
        )
        store = self.store
        at = store.clock() if at is None else at
        shown = store.search(record.embedding, self.k, user=user, types=["semantic"])
        known = duplicate_of(fact, shown, self.duplicate)
        if known is not None:
            decision, decider = Decision("NOOP", known.id, "already known"), "duplicate check"
        else:
            decision, decider = self.decider(fact, shown), type(self.decider).__name__
        if decision.action not in ACTIONS:
            raise ValueError(f"a decider answered {decision.action!r}, not one of {ACTIONS}")
        if fact.negated and decision.action in ("ADD", "UPDATE"):  # a retraction writes nothing
            action = "DELETE" if decision.action == "UPDATE" else "NOOP"
            decision = Decision(action, decision.target, f"{decision.reason}; a retraction")
        if self.linker is not None and decision.action in ("ADD", "UPDATE"):
            record = self.linker.annotate(record)
        with store.transaction():
            action, target, reason = self._current(decision, user)
            written = None
            if action in ("UPDATE", "DELETE"):
                store.invalidate(target, at)
            if action in ("ADD", "UPDATE"):
                record = dataclasses.replace(record, valid_from=at)
                if action == "UPDATE":
                    record = dataclasses.replace(
                        record,
                        links=record.links + (target,),
                        metadata={**record.metadata, "replaces": target},
                    )
                written = insert(store, record, self.linker)
                if action == "UPDATE":
                    old = store.get(target)
                    store.update(target, user=user, links=old.links + (written,))
            log_decision(
                store,
                user=user,
                action=action,
                text=fact.line(),
                shown=[(r.id, s) for r, s in shown],
                target=target,
                result=written,
                reason=reason,
                decider=decider,
            )
        return UpdateResult(fact, action, written, target, reason)

    def _current(self, decision: Decision, user: str) -> Decision:
        """``decision`` if its target is still a valid memory of ``user``; else what is left of
        it (a stale UPDATE still ADDs the new fact; a stale DELETE is a NOOP)."""
        action, target, reason = decision
        if action not in ("UPDATE", "DELETE"):
            return decision
        old = self.store.get(target)
        if old is not None and old.user == user and old.valid_to is None:
            return decision
        stale = f"{reason}; {target} is no longer a valid memory of {user}"
        return Decision("ADD" if action == "UPDATE" else "NOOP", None, stale)
