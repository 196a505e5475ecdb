"""Self-RAG (Asai, Wu, Wang, Sil & Hajishirzi 2023, *Self-RAG: Learning to Retrieve, Generate, and
Critique through Self-Reflection*, arXiv:2310.11511) at inference, with the reflection tokens
asked of the generator as questions instead of trained into it.

The paper's model decides whether to retrieve (``Retrieve``), judges each passage's relevance
(``ISREL``), writes one candidate per passage, judges whether the passage supports it
(``ISSUP``: fully, partially, no support) and how useful it is (``ISUSE``, 1 to 5), and keeps the
candidate with the best weighted critique.  Here each critique is a node, so the path shows
which were asked and the state holds every verdict:

``decide -> retrieve -> relevance -> generate -> support -> usefulness -> select``, with
``decide -> closed_book`` when retrieval would not help and ``relevance -> closed_book`` when
no passage is relevant.  An unreadable verdict takes the cautious value and is recorded:
retrieve, irrelevant, no support, usefulness 1.
"""

from __future__ import annotations

import re

import gin
import pydantic

from agentic_jax.agents.loops.graph import END, CompiledGraph, StateGraph
from agentic_jax.agents.rag.common import (
    Answer,
    Grader,
    Passage,
    RagState,
    TextOf,
    answer_node,
    answer_update,
    fetch,
    grade_all,
    parse_choice,
    relevance_grader,
    text_reader,
    write_answer,
)
from agentic_jax.retrieval import Retriever, as_generator

RETRIEVE_PROMPT = (
    "Would passages from a document collection help answer the question below? Reply with one "
    "word: yes or no.\n\nQuestion: {question}"
)
SUPPORT_PROMPT = (
    "Is every claim of the answer supported by the passage? Reply with one of: fully supported, "
    "partially supported, no support.\n\nPassage: {passage}\n\nQuestion: {question}\n\n"
    "Answer: {answer}"
)
USEFULNESS_PROMPT = (
    "How useful is the answer to the question, from 1 (useless) to 5 (complete and helpful)? "
    "Reply with the number alone.\n\nQuestion: {question}\n\nAnswer: {answer}"
)
DECISION = {"yes": True, "no": False}
SUPPORT = {
    "fully supported": "full",
    "fully": "full",
    "partially supported": "partial",
    "partially": "partial",
    "no support": "none",
    "not supported": "none",
    "unsupported": "none",
}
SUPPORT_SCORE = {"full": 1.0, "partial": 0.5, "none": 0.0}
_RATING = re.compile(r"(?<!\d)([1-5])(?!\d)")


class Candidate(pydantic.BaseModel):
    """An answer written from one passage, with the critiques of it."""

    passage: Passage
    answer: Answer
    support: str | None = None  # full, partial or none
    usefulness: int | None = None  # 1..5
    score: float | None = None


class SelfRagState(RagState):
    retrieve: bool | None = None
    retrieved: list[Passage] = pydantic.Field(default_factory=list)
    relevant: list[Passage] = pydantic.Field(default_factory=list)
    candidates: list[Candidate] = pydantic.Field(default_factory=list)


@gin.configurable(module="rag")
def build_self_rag(
    retriever: Retriever,
    text_of: TextOf,
    generate,
    grader: Grader | None = None,
    k: int = 4,
    support_weight: float = 1.0,
    usefulness_weight: float = 0.25,
    **compile_args,
) -> CompiledGraph:
    """The flow (see the module docstring).  ``grader`` judges relevance (default: the generator
    asked).  A candidate scores ``support_weight * s + usefulness_weight * (u - 1) / 4``, ``s``
    1, 0.5 or 0 for full, partial or no support, ``u`` its usefulness; the default weights let
    usefulness break ties of support but never overturn it.  Equal scores go to the passage
    ranked higher."""
    read, generate = text_reader(text_of), as_generator(generate)
    grader = relevance_grader(grader, generate)

    def decide(state: SelfRagState):
        reply = generate(RETRIEVE_PROMPT.format(question=state.question))
        choice = parse_choice(reply, DECISION)
        failures = [f"decide: unparseable {reply!r}, retrieving"] * (choice is None)
        return {"retrieve": choice is not False, "failures": state.failures + failures}

    def retrieve(state: SelfRagState):
        return {"retrieved": fetch(retriever.search(state.question, k), read)}

    def relevance(state: SelfRagState):
        relevant, failures = grade_all(grader, state.question, state.retrieved)
        return {"relevant": relevant, "failures": state.failures + failures}

    def candidates(state: SelfRagState):
        return {
            "candidates": [
                Candidate(passage=p, answer=write_answer(generate, state.question, [p]))
                for p in state.relevant
            ]
        }

    def critique(prompt: str, parse, field: str):
        """A node asking ``prompt`` of every candidate; ``parse(reply)`` is ``(value, failure)``."""

        def node(state: SelfRagState):
            failures, scored = list(state.failures), []
            for c in state.candidates:
                reply = generate(
                    prompt.format(
                        passage=c.passage.text, question=state.question, answer=c.answer.text
                    )
                )
                value, failure = parse(reply)
                if failure:
                    failures.append(f"{field} of the answer from {c.passage.id}: {failure}")
                scored.append(c.model_copy(update={field: value}))
            return {"candidates": scored, "failures": failures}

        return node

    def parse_support(reply: str):
        support = parse_choice(reply, SUPPORT)
        return (support, None) if support else ("none", f"unparseable {reply!r}, no support")

    def parse_usefulness(reply: str):
        rating = _RATING.search(reply)
        return (int(rating[1]), None) if rating else (1, f"unparseable {reply!r}, rated 1")

    def select(state: SelfRagState):
        scored = [
            c.model_copy(
                update={
                    "score": support_weight * SUPPORT_SCORE[c.support]
                    + usefulness_weight * (c.usefulness - 1) / 4
                }
            )
            for c in state.candidates
        ]
        best = max(scored, key=lambda c: c.score)  # the first of equals: the higher-ranked
        update = answer_update(state, [best.passage], best.answer)
        return {**update, "candidates": scored}

    return (
        StateGraph(SelfRagState)
        .add_node("decide", decide)
        .add_node("retrieve", retrieve)
        .add_node("relevance", relevance)
        .add_node("generate", candidates)
        .add_node("support", critique(SUPPORT_PROMPT, parse_support, "support"))
        .add_node("usefulness", critique(USEFULNESS_PROMPT, parse_usefulness, "usefulness"))
        .add_node("select", select)
        .add_node("closed_book", answer_node(generate, lambda s: []))
        .add_conditional_edges("decide", lambda s: "retrieve" if s.retrieve else "closed_book")
        .add_edge("retrieve", "relevance")
        .add_conditional_edges("relevance", lambda s: "generate" if s.relevant else "closed_book")
        .add_edge("generate", "support")
        .add_edge("support", "usefulness")
        .add_edge("usefulness", "select")
        .add_edge("select", END)
        .add_edge("closed_book", END)
        .compile(**compile_args)
    )
