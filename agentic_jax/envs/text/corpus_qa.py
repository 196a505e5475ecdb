"""Multi-hop questions over the shipped corpus, answered by searching it: Search-R1's task.

The shipped corpus (``data/corpus``: Python and NumPy documentation) is cut into the sections of
its documents, each headed by an object's dotted name.  Of the classes whose short name is unique
and which have methods with a one-sentence summary, the collection holds two kinds of passage:

* a class passage, ``"MIMEText is a class of the module email.mime.text: Class for generating
  text/* type MIME documents."``, the only place that names the module;
* a method passage, ``"MIMEText.__init__: Create a text/* type MIME document."``, which names
  the class but not its module.

A bridge question (``difficulty=2``; HotpotQA's bridge questions, Yang et al. 2018) quotes a
method's summary and asks for the module of its class: the first search finds the method's
passage and with it the bridge entity, the class, which the question never names; the second
searches the class (``"<class> is a class"``, the words its passage starts with) and reads
the module.  ``difficulty=1`` names the class (one search).  Every
other passage is a distractor, the hardest ones by construction: the class's other methods name
the same bridge entity and are the best matches for it after the class passage.  The answer, a
dotted module name, cannot be guessed from the question.

Problems are drawn deterministically by seed; a class is held out when the SHA-256 of its dotted
name is 0 modulo 5, and seeds from `HELDOUT_SEEDS` (``post_training.tasks.HELDOUT_SEED_OFFSET``,
where held-out evaluation and ``agentic-jax eval`` suites draw) ask only about held-out classes,
the others only about the rest, so held-out questions are about classes RL never asked about.
The search tool is `DenseSearch` over the whole collection, on the device (Search-R1, Jin et al.
2025, arXiv:2503.09516, trains the policy to call a search engine between its reasoning turns).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re

import numpy as np

from agentic_jax.data import read_documents
from agentic_jax.data.corpus import SPLITS, corpus_files
from agentic_jax.envs.text.generators import (
    FORMAT,
    Generator,
    final_turn,
    task_prompt,
    tool_turns,
)
from agentic_jax.envs.text.rewards import ExactAnswer, ThinkAnswerFormat, Weighted
from agentic_jax.envs.text.tasks import Task
from agentic_jax.envs.text.tools import DenseSearch, trigram_index

HELDOUT_SEEDS = 1_000_000  # equals post_training.tasks.HELDOUT_SEED_OFFSET (a test checks)
HELDOUT_MODULUS = 5
MAX_ATTEMPTS = 100
HINT = (
    "The search tool finds passages of the Python documentation: a method's passage names its "
    "class, and a class's passage says '<class> is a class of the module <module>'."
)
_HEADING = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+$")
# Characters a jitted tool call carries unescaped (no quote, backslash or '<'; see tools.py).
_PLAIN = re.compile(r"^[A-Za-z0-9 ,.'()*/_-]+$")
_SENTENCE = re.compile(r"(.+?\.)(?:\s|$)")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One class of the collection: dotted name, module, summary and its methods' summaries."""

    name: str  # the short name, unique in the collection
    module: str
    summary: str
    methods: tuple[tuple[str, str], ...]  # (method name, summary)

    @property
    def heldout(self) -> bool:
        digest = hashlib.sha256(f"{self.module}.{self.name}".encode()).digest()
        return int.from_bytes(digest[:8], "big") % HELDOUT_MODULUS == 0

    @property
    def passage(self) -> str:
        return f"{self.name} is a class of the module {self.module}: {self.summary}"

    def method_passage(self, method: str, summary: str) -> str:
        return f"{self.name}.{method}: {summary}"


def _sections(text: str) -> dict[str, str]:
    """A corpus document's sections: each line holding a dotted name alone, followed by a blank
    line, heads the text up to the next such line."""
    out, heading, body = {}, None, []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if _HEADING.match(line) and (i + 1 == len(lines) or not lines[i + 1]):
            if heading:
                out.setdefault(heading, "\n".join(body).strip())
            heading, body = line, []
        else:
            body.append(line)
    if heading:
        out.setdefault(heading, "\n".join(body).strip())
    return out


def _summary(text: str, max_chars: int) -> str | None:
    """The first sentence of a docstring's first paragraph, if plain and short enough."""
    paragraph = " ".join(text.split("\n\n")[0].split())
    match = _SENTENCE.match(paragraph)
    sentence = match.group(1) if match else ""
    return sentence if 15 <= len(sentence) <= max_chars and _PLAIN.match(sentence) else None


@functools.cache
def collection(max_chars: int = 90) -> tuple[Entry, ...]:
    """Every usable class of the shipped corpus (both of its splits), in dotted-name order."""
    sections: dict[str, str] = {}
    for split in SPLITS:
        for document in read_documents(corpus_files(split)):
            for heading, body in _sections(document).items():
                sections.setdefault(heading, body)
    children: dict[str, list[str]] = {}
    for heading in sections:
        parent, _, child = heading.rpartition(".")
        children.setdefault(parent, []).append(child)
    classes = sorted(
        h for h in children if h in sections and h.rpartition(".")[2][:1].isupper() and "." in h
    )
    short = [h.rpartition(".")[2] for h in classes]
    entries = []
    for heading, name in zip(classes, short):
        summary = _summary(sections[heading], max_chars)
        methods = tuple(
            (m, s)
            for m in sorted(children[heading])
            if (s := _summary(sections[f"{heading}.{m}"], max_chars)) is not None
        )
        if short.count(name) == 1 and summary and methods and _PLAIN.match(heading):
            entries.append(Entry(name, heading.rpartition(".")[0], summary, methods))
    return tuple(entries)


@functools.cache
def search_tool(classes: int, top_k: int, embedding_dim: int) -> DenseSearch:
    """The collection's `DenseSearch` (trigram embeddings), one per setting, so that generators
    of several difficulties share it (``task_env`` merges their tools by name)."""
    entries = collection()[: classes or None]
    passages = [e.passage for e in entries]
    passages += [e.method_passage(m, s) for e in entries for m, s in e.methods]
    return DenseSearch(trigram_index(passages, embedding_dim), top_k=top_k)


class CorpusQA(Generator):
    """Questions about the classes of the shipped corpus (module docstring): ``difficulty`` 1
    names the class, 2 quotes one of its methods (a bridge); answered by `DenseSearch` over the
    whole collection.  ``classes``: the first that many classes only (0: all), a smaller
    collection for tests.  Reward: exact answer (0.9) + format (0.1)."""

    def __init__(
        self, difficulty: int = 2, top_k: int = 3, classes: int = 0, embedding_dim: int = 64
    ):
        super().__init__(difficulty)
        if difficulty > 2:
            raise ValueError(
                f"CorpusQA asks one- or two-hop questions, got difficulty {difficulty}"
            )
        self.classes = classes
        self.tools = (search_tool(classes, top_k, embedding_dim),)
        self.reward = Weighted((0.9, ExactAnswer()), (0.1, ThinkAnswerFormat()))

    @property
    def max_turns(self):
        return self.difficulty + 1

    @property
    def entries(self) -> tuple[Entry, ...]:
        return collection()[: self.classes or None]

    def _query(self, summary: str) -> str:
        """The summary's longest prefix of whole words that fits the tool's argument."""
        limit = self.tools[0].argument_bytes
        return summary if len(summary) <= limit else summary[: limit + 1].rsplit(" ", 1)[0]

    def _attempt(self, rng: np.random.Generator, entries, seed: int) -> Task | None:
        entry = entries[int(rng.integers(len(entries)))]
        method, summary = entry.methods[int(rng.integers(len(entry.methods)))]
        if self.difficulty == 1:
            question = f"Which module defines the class {entry.name}?"
            queries = [self._query(f"{entry.name} is a class")]
            needed = [entry.passage]
        else:
            question = (
                f"Which module defines the class that has a method documented as '{summary}'?"
            )
            queries = [self._query(summary), self._query(f"{entry.name} is a class")]
            needed = [entry.method_passage(method, summary), entry.passage]
        task = Task(
            task_prompt(f"{HINT} {FORMAT}", question, self.tools),
            entry.module,
            seed=seed,
            difficulty=self.difficulty,
            family=self.family,
        )
        calls = tool_turns(self.tools[0], queries, task)
        if any(passage not in m.content.split("\n") for passage, m in zip(needed, calls[1::2])):
            return None  # a search missed its passage: ask another question
        thought = f"{entry.name} -> {entry.module}"
        return dataclasses.replace(  # the corrupted answer stops at the bridge entity
            task,
            demonstration=calls + (final_turn(thought, entry.module),),
            corrupted=calls + (final_turn(thought, entry.name),),
        )

    def sample(self, seed):
        rng = np.random.default_rng(seed)
        heldout = seed >= HELDOUT_SEEDS
        entries = [e for e in self.entries if e.heldout == heldout]
        if not entries:
            raise ValueError(
                f"no {'held-out' if heldout else 'train'} classes among {self.entries}"
            )
        for _ in range(MAX_ATTEMPTS):
            if (task := self._attempt(rng, entries, seed)) is not None:
                return task
        raise RuntimeError(
            f"no question of seed {seed} is answerable by searching (top_k too small?)"
        )
