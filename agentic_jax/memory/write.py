"""The write policy: what goes into memory, and how.

A memory is written in four steps (:class:`MemoryWriter`):

1. **Redaction.**  Personal data is removed before anything is embedded or stored (a stored
   e-mail address would be recalled into any later prompt, and an embedding can leak it too):
   the ``redact`` hook maps text to text; :func:`redact_pii`, the default, replaces e-mail
   addresses, phone numbers and card-like numbers with ``[EMAIL]``, ``[PHONE]``, ``[CARD]``.
   Regular expressions catch formats, not meaning: a deployment with stricter needs passes its
   own hook (a NER model, say).
2. **Importance** (Park et al. 2023, *Generative Agents*, §4.1: "poignancy" from 1, mundane, to
   10, extremely poignant), by :class:`ImportanceScorer`: by rules (regular expressions for
   what agents should keep: explicit requests to remember, preferences, commitments, numbers),
   by a model asked Park et al.'s question and parsed robustly (:func:`parse_importance`), or
   both, averaged with a weight; a model answer that holds no rating falls back to the rules.
3. **Near-duplicate detection.**  The nearest existing record of the same user and type by
   cosine similarity of embeddings; at or above ``threshold`` the new one is a duplicate and is
   ``skip``-ped (the store keeps the old one; its access time is refreshed) or ``merge``-d into
   it (the higher importance, the union of links, the metadata updated, the access time
   refreshed; the old text stays).  Check and insert run in one store transaction, so a
   second writer cannot insert the same memory between them.
4. **Insertion** with its embedding.

Mem0's extract-then-decide updates (ADD / UPDATE / DELETE / NOOP) build on this: see issue 25.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Sequence

import gin
import numpy as np

from agentic_jax.memory.records import MemoryRecord
from agentic_jax.memory.store import MemoryStore

Embed = Callable[[list[str]], np.ndarray]

_EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")
# 13 to 19 digits, optionally grouped by spaces or dashes (payment card numbers, ISO/IEC 7812).
_CARD = re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])")
# International (+country code, then 2-4 groups) or North American (3-3-4) numbers.
_PHONE = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}[ .-]?(?:\(\d{1,4}\)|\d{1,4})(?:[ .-]?\d{2,4}){2,4}"
    r"|(?:\(\d{3}\)\s?|\d{3}[ .-]?)\d{3}[ .-]?\d{4})(?![\w-])"
)


def redact_pii(text: str) -> str:
    """``text`` with e-mail addresses, card-like numbers and phone numbers (in that order, so a
    card is not read as a phone number) replaced by ``[EMAIL]``, ``[CARD]``, ``[PHONE]``."""
    text = _EMAIL.sub("[EMAIL]", text)
    text = _CARD.sub("[CARD]", text)
    return _PHONE.sub("[PHONE]", text)


IMPORTANCE_PROMPT = (
    "On the scale of 1 to 10, where 1 is purely mundane (e.g., brushing teeth, making bed) and "
    "10 is extremely poignant (e.g., a break up, college acceptance), rate the likely poignancy "
    "of the following piece of memory.\nMemory: {text}\nRating: <fill in>"
)  # Park et al. 2023, appendix: the prompt that scores a memory's importance
_NUMBER = r"(\d+(?:\.\d+)?)"
_WORDS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
_SCALE = re.compile(
    r"(?:scale|range)\s+(?:of|from)?\s*1\s*(?:to|-|–)\s*10|\b1\s*(?:to|-|–)\s*10\b", re.I
)
_OUT_OF_TEN = re.compile(_NUMBER + r"\s*(?:/|out\s+of)\s*10\b", re.I)
_LABELLED = re.compile(r"(?:rating|rate|score|importance|poignancy)\D{0,20}?" + _NUMBER, re.I)
_ANY = re.compile(r"(?<![\d.])" + _NUMBER + "|\\b(" + "|".join(_WORDS) + r")\b", re.I)


def parse_importance(reply: str) -> float | None:
    """The 1-10 rating in a model's reply, or ``None``.  Models pad their answers, echo the
    scale and explain themselves, so the reply is read in order of evidence: a number "out of
    10" (``7/10``), then one labelled (``Rating: 7``), then the first number or number word from
    one to ten, after removing echoes of the scale ("on a scale of 1 to 10").  A number outside
    [1, 10] is no rating."""
    text = _SCALE.sub(" ", reply)
    for pattern in (_OUT_OF_TEN, _LABELLED, _ANY):
        for match in pattern.finditer(text):
            number, word = match.group(1), match.group(2) if pattern is _ANY else None
            value = float(number) if number else _WORDS.index(word.lower()) + 1
            if 1 <= value <= 10:
                return value
            if pattern is not _ANY:
                break  # a labelled number out of range is an invalid rating, not a rating
    return None


RULES: tuple[tuple[str, float], ...] = (
    (r"\b(remember|don't forget|do not forget|important|always|never|must)\b", 3.0),
    (r"\b(prefer\w*|likes?|loves?|hates?|dislikes?|allergic|favou?rite)\b", 2.0),
    (r"\b(deadline|due|appointment|meeting|birthday|tomorrow|tonight|next week)\b", 2.0),
    (r"\b(failed|error|broke|succeeded|learned|lesson)\b", 1.0),
    (r"\d", 1.0),
)  # (pattern, points): what an assistant should keep about its user and its work


@gin.configurable(module="memory")
class ImportanceScorer:
    """Importance from 1 to 10 by ``rules`` (``base`` plus the points of every rule whose
    pattern, case-insensitive, occurs in the text, clipped to [1, 10]), by a model
    (``generate``: a ``prompt -> text`` callable asked ``prompt``; a policy becomes one by
    ``retrieval.as_generator(policy, temperature=0.0)``), or both:
    ``model_weight · model + (1 − model_weight) · rules``.  ``rules=None`` scores by the model
    alone, ``fallback`` when it gives no rating."""

    def __init__(
        self,
        rules: Sequence[tuple[str, float]] | None = RULES,
        generate: Callable[[str], str] | None = None,
        *,
        base: float = 1.0,
        model_weight: float = 0.5,
        prompt: str = IMPORTANCE_PROMPT,
        fallback: float = 5.0,
    ):
        if rules is None and generate is None:
            raise ValueError("importance needs rules, a model or both")
        if not 0 <= model_weight <= 1:
            raise ValueError(f"model_weight must be in [0, 1], got {model_weight}")
        self.rules = None if rules is None else [(re.compile(p, re.I), w) for p, w in rules]
        self.generate = generate
        self.base, self.model_weight, self.prompt, self.fallback = (
            base,
            model_weight,
            prompt,
            fallback,
        )

    def by_rules(self, text: str) -> float:
        points = self.base + sum(w for pattern, w in self.rules if pattern.search(text))
        return min(max(points, 1.0), 10.0)

    def by_model(self, text: str) -> float | None:
        return parse_importance(self.generate(self.prompt.format(text=text)))

    def __call__(self, text: str) -> float:
        model = None if self.generate is None else self.by_model(text)
        if self.rules is None:
            return self.fallback if model is None else model
        rules = self.by_rules(text)
        return (
            rules if model is None else self.model_weight * model + (1 - self.model_weight) * rules
        )


@dataclasses.dataclass(frozen=True)
class WriteResult:
    """``action`` is ``added``, ``skipped`` (a duplicate of ``id``) or ``merged`` (into ``id``);
    ``similarity`` is the nearest existing record's (``nan`` when there was none)."""

    action: str
    id: str
    similarity: float = math.nan


DUPLICATE_ACTIONS = ("skip", "merge")


@gin.configurable(module="memory")
class MemoryWriter:
    """Writes memories into ``store`` by the policy of the module docstring.  ``embed`` maps
    texts to ``[n, dim]`` vectors (any encoder); ``importance`` scores a text (default: the
    rules); ``redact`` cleans a text (``None``: store it as given)."""

    def __init__(
        self,
        store: MemoryStore,
        embed: Embed,
        *,
        importance: Callable[[str], float] | None = None,
        redact: Callable[[str], str] | None = redact_pii,
        threshold: float = 0.95,
        on_duplicate: str = "skip",
    ):
        if on_duplicate not in DUPLICATE_ACTIONS:
            raise ValueError(f"on_duplicate must be one of {DUPLICATE_ACTIONS}: {on_duplicate!r}")
        self.store, self.embed, self.redact = store, embed, redact
        self.importance = ImportanceScorer() if importance is None else importance
        self.threshold, self.on_duplicate = threshold, on_duplicate

    def prepare(self, record: MemoryRecord) -> MemoryRecord:
        """The record as it would be stored: redacted (text and outcome), embedded, scored."""
        if self.redact is not None:
            record = dataclasses.replace(
                record,
                text=self.redact(record.text),
                outcome=None if record.outcome is None else self.redact(record.outcome),
            )
        if record.embedding is None:
            record = dataclasses.replace(record, embedding=np.asarray(self.embed([record.text]))[0])
        if record.importance is None:
            record = dataclasses.replace(record, importance=float(self.importance(record.text)))
        return record

    def write(self, record: MemoryRecord) -> WriteResult:
        """Stores ``record`` unless it duplicates one (see the module docstring)."""
        record = self.prepare(record)
        store = self.store
        with store.transaction():
            nearest = store.search(record.embedding, 1, user=record.user, types=[record.type])
            if not nearest or nearest[0][1] < self.threshold:
                store.add(record)
                return WriteResult("added", record.id, nearest[0][1] if nearest else math.nan)
            old, similarity = nearest[0]
            changes = {"accessed_at": store.clock()}
            if self.on_duplicate == "merge":
                changes.update(
                    importance=max(old.importance, record.importance),
                    links=tuple(dict.fromkeys(old.links + record.links)),
                    metadata={**old.metadata, **record.metadata},
                )
            store.update(old.id, user=old.user, **changes)
        action = "merged" if self.on_duplicate == "merge" else "skipped"
        return WriteResult(action, old.id, similarity)
