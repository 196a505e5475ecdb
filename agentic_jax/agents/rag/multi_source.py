"""Multi-source routing: several retrievers (documentation, code, a fact store), each described
in a sentence, and a router that sends the question to the ones that can answer it, as in the
routing step of modular RAG (Gao et al. 2023, *Retrieval-Augmented Generation for Large Language
Models: A Survey*, arXiv:2312.10997) and the routing workflow of Anthropic's *Building effective
agents* (2024).  Searching only the right sources keeps code out of a prose answer's context,
and costs fewer searches.

The router is any ``question -> names`` callable (a list, or a reply to read) or the generator
asked with the sources' descriptions.  One source's hits are used as ranked; several sources'
are fused by reciprocal rank fusion (Cormack et al. 2009), which needs only ranks, as their
scores (BM25's, a cosine) are not comparable.  Chunk ids must be unique across the sources (those
of ``retrieval.chunk_documents`` are): one ``text_of`` reads them all, and an id two sources
return is one chunk to the fusion.

Graph: ``route -> retrieve -> answer``.  A reply naming no source sends the question to every
source, a list naming an unknown one has it dropped; both are recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import gin
import pydantic

from agentic_jax.agents.loops.graph import END, CompiledGraph, StateGraph
from agentic_jax.agents.rag.common import (
    RagState,
    TextOf,
    answer_node,
    fetch,
    mentioned,
    text_reader,
)
from agentic_jax.retrieval import RRF_K, Retriever, as_generator, reciprocal_rank_fusion

ROUTE_PROMPT = (
    "Which of these sources can answer the question? Reply with their names, separated by "
    "commas, nothing else.\n\n{sources}\n\nQuestion: {question}"
)


class Source(NamedTuple):
    retriever: Retriever
    description: str


class MultiSourceState(RagState):
    sources: list[str] = pydantic.Field(
        default_factory=list
    )  # the routed sources, in the order given
    rankings: dict[str, list[str]] = pydantic.Field(
        default_factory=dict
    )  # each routed source's chunk ids, best first


@gin.configurable(module="rag")
def build_multi_source_rag(
    sources: Mapping[str, Source],
    text_of: TextOf,
    generate,
    router: Callable[[str], str | Sequence[str]] | None = None,
    k: int = 4,
    depth: int | None = None,
    rrf_k: int = RRF_K,
    **compile_args,
) -> CompiledGraph:
    """The flow (see the module docstring): each routed source is searched ``depth`` deep
    (default: ``k``) and the ``k`` best fused chunks are the context."""
    if not sources:
        raise ValueError("multi-source routing needs at least one source")
    read, generate = text_reader(text_of), as_generator(generate)
    names = list(sources)
    listing = "\n".join(f"- {name}: {source.description}" for name, source in sources.items())
    route_question = router or (
        lambda q: generate(ROUTE_PROMPT.format(sources=listing, question=q))
    )

    def route(state: MultiSourceState):
        choice = route_question(state.question)
        if isinstance(choice, str):
            chosen = set(mentioned(choice, names))
            failures = [f"route: unparseable {choice!r}, every source"] * (not chosen)
        else:
            chosen = set(choice) & set(names)
            failures = [f"route: unknown source {n!r} dropped" for n in choice if n not in sources]
            failures += ["route: no source, every source"] * (not chosen)
        return {
            "sources": [n for n in names if n in chosen] or names,
            "failures": state.failures + failures,
        }

    def retrieve(state: MultiSourceState):
        rankings = {
            n: sources[n].retriever.search(state.question, depth or k) for n in state.sources
        }
        hits = list(rankings.values())
        fused = hits[0][:k] if len(hits) == 1 else reciprocal_rank_fusion(hits, rrf_k)[:k]
        return {
            "rankings": {n: [h.id for h in ranking] for n, ranking in rankings.items()},
            "passages": fetch(fused, read),
        }

    return (
        StateGraph(MultiSourceState)
        .add_node("route", route)
        .add_node("retrieve", retrieve)
        .add_node("answer", answer_node(generate, lambda s: s.passages))
        .add_edge("route", "retrieve")
        .add_edge("retrieve", "answer")
        .add_edge("answer", END)
        .compile(**compile_args)
    )
