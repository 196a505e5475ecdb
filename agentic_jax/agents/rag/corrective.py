"""Corrective RAG (Yan, Gu, Zhu & Ling 2024, *Corrective Retrieval Augmented Generation*,
arXiv:2401.15884): grade what was retrieved before trusting it, and search again when it is
wrong.

The paper's lightweight evaluator scores each retrieved document; when none is correct, it
rewrites the question as a search query and searches elsewhere (the web).  Here a grader (any
``(question, passage) -> verdict`` callable, or the generator asked) marks each chunk relevant or
not; while fewer than ``min_relevant`` chunks are relevant and retries remain, the generator
rewrites the query (told which queries failed) and the retriever is searched again.  The answer
is written from the relevant chunks of every attempt.

Graph: ``retrieve -> grade -> (rewrite -> retrieve -> grade)* -> answer``; ``attempts`` records
each search's query, what it found and what passed.  An unreadable grade counts as irrelevant
and is recorded; so is an unusable rewrite (empty, or a query already tried), which ends the
retries.
"""

from __future__ import annotations

import re

import gin
import pydantic

from agentic_jax.agents.loops.graph import END, CompiledGraph, StateGraph
from agentic_jax.agents.rag.common import (
    Grader,
    Passage,
    RagState,
    TextOf,
    answer_node,
    fetch,
    grade_all,
    relevance_grader,
    text_reader,
)
from agentic_jax.retrieval import Retriever, as_generator, parse_queries

REWRITE_PROMPT = (
    "These search queries found nothing that answers the question below: {tried}. Write one "
    "different search query for a document search engine that would. Answer with the query "
    "alone.\n\nQuestion: {question}"
)
# A label before the query ("Query: ...", "Search query: ..."), which models write though told not to.
_LABEL = re.compile(r"^(?:search\s+)?query\s*:\s*", re.IGNORECASE)


class Attempt(pydantic.BaseModel):
    query: str
    retrieved: list[str]
    relevant: list[str]


class CorrectiveState(RagState):
    query: str | None = None  # the next search's query (None: the question)
    retrieved: list[Passage] = pydantic.Field(default_factory=list)  # the last search's chunks
    relevant: list[Passage] = pydantic.Field(
        default_factory=list
    )  # every attempt's relevant chunks
    attempts: list[Attempt] = pydantic.Field(default_factory=list)


@gin.configurable(module="rag")
def build_corrective_rag(
    retriever: Retriever,
    text_of: TextOf,
    generate,
    grader: Grader | None = None,
    k: int = 4,
    min_relevant: int = 1,
    max_retries: int = 2,
    **compile_args,
) -> CompiledGraph:
    """The flow (see the module docstring): at most ``1 + max_retries`` searches of ``k``
    chunks, stopping as soon as ``min_relevant`` relevant chunks are in hand.  With none after
    the last, the answer is closed-book and the failure recorded."""
    read, generate = text_reader(text_of), as_generator(generate)
    grader = relevance_grader(grader, generate)

    def retrieve(state: CorrectiveState):
        query = state.query or state.question
        return {"query": query, "retrieved": fetch(retriever.search(query, k), read)}

    def grade(state: CorrectiveState):
        relevant, failures = grade_all(grader, state.question, state.retrieved)
        attempt = Attempt(
            query=state.query,
            retrieved=[p.id for p in state.retrieved],
            relevant=[p.id for p in relevant],
        )
        known = {p.id for p in state.relevant}
        return {
            "relevant": state.relevant + [p for p in relevant if p.id not in known],
            "attempts": state.attempts + [attempt],
            "failures": state.failures + failures,
        }

    def after_grade(state: CorrectiveState) -> str:
        enough = len(state.relevant) >= min_relevant
        return "answer" if enough or len(state.attempts) > max_retries else "rewrite"

    def rewrite(state: CorrectiveState):
        tried = [a.query for a in state.attempts]
        reply = generate(
            REWRITE_PROMPT.format(tried="; ".join(map(repr, tried)), question=state.question)
        )
        query = _LABEL.sub("", next(iter(parse_queries(reply)), "")).strip("\"'")
        if query and query not in tried:
            return {"query": query}
        return {"failures": state.failures + [f"rewrite: unusable {reply!r}, stopping retries"]}

    answer_relevant = answer_node(generate, lambda s: s.relevant)

    def answer(state: CorrectiveState):
        update = answer_relevant(state)
        if not state.relevant:
            update["failures"].append(
                f"answer: no relevant chunk in {len(state.attempts)} searches, closed-book"
            )
        return update

    return (
        StateGraph(CorrectiveState)
        .add_node("retrieve", retrieve)
        .add_node("grade", grade)
        .add_node("rewrite", rewrite)
        .add_node("answer", answer)
        .add_edge("retrieve", "grade")
        .add_conditional_edges("grade", after_grade)
        .add_conditional_edges(
            "rewrite",
            lambda s: "answer" if s.query in {a.query for a in s.attempts} else "retrieve",
        )
        .add_edge("answer", END)
        .compile(**compile_args)
    )
