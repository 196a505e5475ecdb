"""Adaptive RAG (Jeong, Baek, Cho, Hwang & Park 2024, *Adaptive-RAG: Learning to Adapt
Retrieval-Augmented Large Language Models through Question Complexity*, arXiv:2403.14403):
spend retrieval where the question needs it.

A classifier estimates the question's difficulty and routes it: ``simple`` questions are
answered without retrieval, ``moderate`` ones from one search, ``complex`` (multi-hop) ones by
iterative retrieval, where after each search the generator either says the passages suffice or
names the next query (the interleaving of IRCoT, Trivedi et al. 2023, arXiv:2212.10509, which
the paper uses for its multi-step strategy), up to ``max_steps`` searches.  The classifier is
any ``question -> label`` callable (the paper trains a small one) or the generator asked.

Graph: ``classify`` then ``closed_book``, ``retrieve -> answer``, or
``search -> reason -> (search -> reason)* -> answer``.  An unreadable difficulty counts as
``moderate`` (one search: cheap, and safer than none) and an unreadable reasoning step ends the
search; both are recorded.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import gin
import pydantic

from agentic_jax.agents.loops.graph import END, CompiledGraph, StateGraph
from agentic_jax.agents.rag.common import (
    RagState,
    TextOf,
    answer_node,
    fetch,
    numbered,
    parse_choice,
    text_reader,
)
from agentic_jax.retrieval import Retriever, as_generator

DIFFICULTY_PROMPT = (
    "How hard is the question below to answer? Reply with one word: simple (known without "
    "looking anything up), moderate (one look-up in a document collection) or complex (needs "
    "several look-ups, each depending on the last).\n\nQuestion: {question}"
)
REASON_PROMPT = (
    "Question: {question}\n\nPassages found so far:\n{context}\n\nIf the passages hold "
    "everything needed to answer the question, reply DONE. Otherwise reply SEARCH: followed by "
    "the one search query that finds what is missing."
)
DIFFICULTY = {"simple": "simple", "moderate": "moderate", "complex": "complex"}
BRANCH = {"simple": "closed_book", "moderate": "retrieve", "complex": "search"}
_SEARCH = re.compile(r"^\W*search\W*:\s*(.+?)\s*$", re.IGNORECASE | re.MULTILINE)
_DONE = re.compile(r"(?<!\w)done(?!\w)", re.IGNORECASE)


class AdaptiveState(RagState):
    difficulty: str | None = None  # simple, moderate or complex
    queries: list[str] = pydantic.Field(default_factory=list)  # searched, in order
    next_query: str | None = None


@gin.configurable(module="rag")
def build_adaptive_rag(
    retriever: Retriever,
    text_of: TextOf,
    generate,
    classifier: Callable[[str], str] | None = None,
    k: int = 4,
    max_steps: int = 3,
    **compile_args,
) -> CompiledGraph:
    """The flow (see the module docstring); ``classifier(question)`` is read like the
    generator's reply to ``DIFFICULTY_PROMPT``."""
    read, generate = text_reader(text_of), as_generator(generate)
    classify_question = classifier or (lambda q: generate(DIFFICULTY_PROMPT.format(question=q)))

    def classify(state: AdaptiveState):
        reply = classify_question(state.question)
        difficulty = parse_choice(reply, DIFFICULTY)
        failures = [f"classify: unparseable {reply!r}, moderate"] * (difficulty is None)
        return {"difficulty": difficulty or "moderate", "failures": state.failures + failures}

    def retrieve(state: AdaptiveState):
        return {"passages": fetch(retriever.search(state.question, k), read)}

    def search(state: AdaptiveState):
        query = state.next_query or state.question
        known = {p.id for p in state.passages}
        found = [p for p in fetch(retriever.search(query, k), read) if p.id not in known]
        return {
            "queries": state.queries + [query],
            "passages": state.passages + found,
            "next_query": None,
        }

    def reason(state: AdaptiveState):
        reply = generate(
            REASON_PROMPT.format(question=state.question, context=numbered(state.passages))
        )
        query = _SEARCH.search(reply)
        if query and query[1] not in state.queries:
            return {"next_query": query[1]}
        if query or not _DONE.search(reply):
            failure = f"reason: {'repeated' if query else 'unparseable'} {reply!r}, answering"
            return {"failures": state.failures + [failure]}
        return None

    def after_reason(state: AdaptiveState) -> str:
        more = state.next_query is not None and len(state.queries) < max_steps
        return "search" if more else "answer"

    answer = answer_node(generate, lambda s: s.passages)
    return (
        StateGraph(AdaptiveState)
        .add_node("classify", classify)
        .add_node("closed_book", answer_node(generate, lambda s: []))
        .add_node("retrieve", retrieve)
        .add_node("answer", answer)
        .add_node("search", search)
        .add_node("reason", reason)
        .add_conditional_edges("classify", lambda s: BRANCH[s.difficulty])
        .add_edge("closed_book", END)
        .add_edge("retrieve", "answer")
        .add_edge("search", "reason")
        .add_conditional_edges("reason", after_reason)
        .add_edge("answer", END)
        .compile(**compile_args)
    )
