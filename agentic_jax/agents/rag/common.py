"""What every RAG control flow shares: passages, the numbered context and its citations, the
answer step, relevance grading and the parsing of a model's one-word verdicts.

A model's reply is free text; each parser here reads what it can and says when it could not, so
a flow records the failure in its state (``failures``) and takes a stated default instead of
crashing or guessing silently.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

import pydantic

from agentic_jax.agents.loops.graph import CompiledGraph
from agentic_jax.retrieval import Hit

T = TypeVar("T")
Generate = Callable[[str], str]
TextOf = Callable[[str], str] | Mapping[str, str]
# A relevance judge: (question, passage text) -> a verdict, True/False or a reply to parse.
Grader = Callable[[str, str], bool | str]

ANSWER_PROMPT = (
    "Answer the question using only the numbered passages below. After each claim, cite the "
    "passages that support it by their number in brackets, like [1] or [2][3]. If the passages "
    "do not hold the answer, say so.\n\n{context}\n\nQuestion: {question}\n\nAnswer:"
)
CLOSED_BOOK_PROMPT = "Answer the question.\n\nQuestion: {question}\n\nAnswer:"
RELEVANCE_PROMPT = (
    "Does the passage help answer the question? Reply with one word: relevant or irrelevant."
    "\n\nQuestion: {question}\n\nPassage: {passage}"
)
RELEVANCE = {"relevant": True, "irrelevant": False, "not relevant": False, "yes": True, "no": False}

_CITATION = re.compile(r"\[\s*(\d+(?:\s*[,;]\s*\d+)*)\s*\]")


class Passage(pydantic.BaseModel):
    id: str
    text: str


class RagState(pydantic.BaseModel):
    """The fields every flow's state has: the ``passages`` the answer was written from (numbered
    from 1 in its prompt), the chunk ids it ``cited``, the ``[n]`` markers it wrote that name no
    passage, and a record of every model reply that could not be parsed."""

    question: str
    passages: list[Passage] = []
    answer: str | None = None
    cited: list[str] = []
    dropped_citations: list[int] = []
    failures: list[str] = []


def text_reader(text_of: TextOf) -> Callable[[str], str]:
    """A chunk id -> text function from a mapping or a function."""
    return text_of.__getitem__ if isinstance(text_of, Mapping) else text_of


def fetch(hits: Sequence[Hit], read: Callable[[str], str]) -> list[Passage]:
    return [Passage(id=hit.id, text=read(hit.id)) for hit in hits]


def numbered(passages: Sequence[Passage]) -> str:
    """The passages as ``[1] text`` blocks, the numbers an answer cites."""
    return "\n\n".join(f"[{i}] {p.text}" for i, p in enumerate(passages, 1))


def parse_citations(answer: str, n: int) -> tuple[list[int], list[int]]:
    """The passage numbers ``answer`` cites (``[2]``, ``[1, 3]``), first mention first, and those
    outside ``1..n``, which cite nothing (a model inventing a fifth of four passages)."""
    cited = [int(m) for group in _CITATION.findall(answer) for m in re.split(r"[,;]", group)]
    cited = list(dict.fromkeys(cited))
    return [c for c in cited if 1 <= c <= n], [c for c in cited if not 1 <= c <= n]


class Answer(pydantic.BaseModel):
    """A reply written from numbered passages: its ``text``, the ids it ``cited``, the markers
    that name no passage and what went wrong reading it."""

    text: str
    cited: list[str] = []
    dropped_citations: list[int] = []
    failures: list[str] = []


def write_answer(
    generate: Generate, question: str, passages: Sequence[Passage], context: str | None = None
) -> Answer:
    """The answer step of every flow: with passages, ``ANSWER_PROMPT`` over them numbered (or
    over ``context``, which must number them the same way) and the citations parsed; without,
    ``CLOSED_BOOK_PROMPT`` (unless a ``context`` is given).  An answer from passages that cites
    none of them is kept and its failure recorded: a caller checking faithfulness must know it
    is unsupported."""
    if not passages and context is None:
        return Answer(text=generate(CLOSED_BOOK_PROMPT.format(question=question)).strip())
    prompt = ANSWER_PROMPT.format(
        context=numbered(passages) if context is None else context, question=question
    )
    text = generate(prompt).strip()
    cited, dropped = parse_citations(text, len(passages))
    failures = [f"answer: dropped citations {dropped} of {len(passages)} passages"] * bool(dropped)
    failures += ["answer: cites no passage"] * (not cited)
    return Answer(
        text=text,
        cited=[passages[c - 1].id for c in cited],
        dropped_citations=dropped,
        failures=failures,
    )


def answer_update(state: RagState, passages: Sequence[Passage], answer: Answer) -> dict:
    """The state fields ``answer`` (written from ``passages``) sets, its failures recorded."""
    return {
        "passages": list(passages),
        "answer": answer.text,
        "cited": answer.cited,
        "dropped_citations": answer.dropped_citations,
        "failures": state.failures + answer.failures,
    }


def answer_node(generate: Generate, passages: Callable[[RagState], Sequence[Passage]]):
    """A node answering from ``passages(state)`` (closed-book when there are none)."""

    def node(state: RagState) -> dict:
        chosen = passages(state)
        return answer_update(state, chosen, write_answer(generate, state.question, chosen))

    return node


def mentioned(reply: str, names: Iterable[str]) -> list[str]:
    """The ``names`` that ``reply`` holds as whole words, ignoring case, in the order they first
    occur; at one position the longest first.  "irrelevant" does not hold ``relevant``, nor
    ``code_review`` ``code``."""
    text = " ".join(reply.lower().split())
    found = sorted(
        (m.start(), -len(name), name)
        for name in names
        for m in re.finditer(rf"(?<!\w){re.escape(name.lower())}(?!\w)", text)
    )
    return list(dict.fromkeys(name for _, _, name in found))


def parse_choice(reply: str, choices: Mapping[str, T]) -> T | None:
    """The value of the choice ``reply`` names first (see :func:`mentioned`): "Not relevant." is
    ``not relevant``, never ``relevant``.  ``None`` when it names none."""
    found = mentioned(reply, choices)
    return choices[found[0]] if found else None


def relevance_grader(grader: Grader | None, generate: Generate) -> Grader:
    """``grader``, or the generator asked ``RELEVANCE_PROMPT``."""
    if grader is not None:
        return grader
    return lambda question, passage: generate(
        RELEVANCE_PROMPT.format(question=question, passage=passage)
    )


def grade(grader: Grader, question: str, passage: Passage) -> tuple[bool, str | None]:
    """Whether ``passage`` is relevant, and a failure record when the verdict was unreadable:
    then it counts as irrelevant (an unjudged passage must not reach the answer as evidence)."""
    verdict = grader(question, passage.text)
    if isinstance(verdict, bool):
        return verdict, None
    relevant = parse_choice(verdict, RELEVANCE)
    if relevant is None:
        return False, f"grade of {passage.id}: unparseable {verdict!r}, counted irrelevant"
    return relevant, None


def grade_all(
    grader: Grader, question: str, passages: Sequence[Passage]
) -> tuple[list[Passage], list[str]]:
    """The relevant ``passages``, in order, and the failures of reading their grades."""
    verdicts = [grade(grader, question, p) for p in passages]
    return [p for p, (ok, _) in zip(passages, verdicts) if ok], [f for _, f in verdicts if f]


def run(graph: CompiledGraph, question: str, *, thread_id: str = "main"):
    """Runs a flow on ``question`` and returns its final state (``graph.invoke`` gives the
    status and the path of nodes too)."""
    return graph.invoke({"question": question}, thread_id=thread_id).state
