"""Graph RAG (Edge et al. 2024, *From Local to Global: A Graph RAG Approach to Query-Focused
Summarization*, arXiv:2404.16130; its local search): answer from the facts around the question's
entities rather than from the chunks most like the question.

The generator reads each chunk's facts as ``(subject | relation | object)`` lines, which go into
a :class:`~agentic_jax.retrieval.graph.TripleGraph` with the chunk as their source; the
question's entities are found in the graph by name, and the facts within ``hops`` hops of them,
with the chunks they came from, are the context.  A chain ("A founded B", "B is based in C")
reaches the answer to "where is A's company based?" though no chunk holds both facts.

The graph may be built beforehand over a whole corpus (:func:`index_chunks`) and is extended
during a run with the facts of the retrieved chunks not read yet; it lives outside the state
(the state records what each step read and found).  Graph:
``retrieve -> extract -> match -> expand -> answer``.  Lines of the extractor's reply that are
not a triple are recorded and skipped; a question with no entity in the graph (or no facts
around it) is answered from the retrieved chunks, and that is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import gin
import pydantic

from agentic_jax.agents.loops.graph import END, CompiledGraph, StateGraph
from agentic_jax.agents.rag.common import (
    Generate,
    Passage,
    RagState,
    TextOf,
    answer_update,
    fetch,
    numbered,
    text_reader,
    write_answer,
)
from agentic_jax.retrieval import Retriever, as_generator
from agentic_jax.retrieval.graph import Triple, TripleGraph, parse_triples

EXTRACT_PROMPT = (
    "List the facts the passage states as (subject | relation | object) triples, one per line, "
    "nothing else. Name entities as the passage does.\n\nPassage: {passage}"
)


class GraphRagState(RagState):
    retrieved: list[Passage] = pydantic.Field(default_factory=list)
    extracted: list[str] = pydantic.Field(default_factory=list)  # chunks whose facts this run read
    entities: list[str] = pydantic.Field(
        default_factory=list
    )  # the question's entities found in the graph
    triples: list[Triple] = pydantic.Field(
        default_factory=list
    )  # the facts within the hops, the context


def extract(graph: TripleGraph, passage: Passage, generate: Generate) -> list[str]:
    """Adds the facts ``generate`` reads in ``passage`` (its id their source) to ``graph`` and
    marks the chunk read; returns the reply's lines that are not triples."""
    triples, rejected = parse_triples(generate(EXTRACT_PROMPT.format(passage=passage.text)))
    for subject, relation, obj in triples:
        graph.add(subject, relation, obj, source=passage.id)
    graph.sources.add(passage.id)
    return rejected


def index_chunks(
    graph: TripleGraph, ids: Iterable[str], text_of: TextOf, generate
) -> dict[str, list[str]]:
    """Reads the facts of every chunk of ``ids`` into ``graph`` (the offline indexing of Graph
    RAG); returns ``{chunk id: rejected lines}`` for the chunks with any."""
    read, generate = text_reader(text_of), as_generator(generate)
    rejected = {i: extract(graph, Passage(id=i, text=read(i)), generate) for i in ids}
    return {i: lines for i, lines in rejected.items() if lines}


def fact_context(triples: list[Triple], passages: list[Passage]) -> str:
    """The facts, each followed by the ``[n]`` of its source among ``passages``, then the
    numbered passages: a citation of a fact cites its chunk."""
    number = {p.id: i for i, p in enumerate(passages, 1)}
    facts = [t.line() + (f" [{number[t.source]}]" if t.source in number else "") for t in triples]
    return "Facts:\n" + "\n".join(facts) + "\n\nPassages:\n" + numbered(passages)


@gin.configurable(module="rag")
def build_graph_rag(
    retriever: Retriever,
    text_of: TextOf,
    generate,
    graph: TripleGraph | None = None,
    k: int = 4,
    hops: int = 2,
    at: Callable[[], object] | None = None,
    **compile_args,
) -> CompiledGraph:
    """The flow over ``graph`` (default: a new, empty one, filled from the retrieved chunks).
    ``at`` (a function of no arguments, e.g. the clock) restricts the facts to those valid at
    its value when the question is asked; default: every fact."""
    read, generate = text_reader(text_of), as_generator(generate)
    graph = TripleGraph() if graph is None else graph

    def retrieve(state: GraphRagState):
        return {"retrieved": fetch(retriever.search(state.question, k), read)}

    def extract_new(state: GraphRagState):
        new = [p for p in state.retrieved if p.id not in graph.sources]
        failures = [
            f"extract from {p.id}: not a triple: {line!r}"
            for p in new
            for line in extract(graph, p, generate)
        ]
        return {"extracted": [p.id for p in new], "failures": state.failures + failures}

    def match(state: GraphRagState):
        entities = graph.mentions(state.question)
        failures = ["match: no entity of the question is in the graph"] * (not entities)
        return {"entities": entities, "failures": state.failures + failures}

    def expand(state: GraphRagState):
        when = at() if at is not None else None
        return {"triples": graph.neighbourhood(state.entities, hops, at=when)}

    def answer(state: GraphRagState):
        if not state.triples:
            answer = write_answer(generate, state.question, state.retrieved)
            update = answer_update(state, state.retrieved, answer)
            update["failures"].append("answer: no facts around the question, from the chunks")
            return update
        sources = dict.fromkeys(t.source for t in state.triples if t.source is not None)
        passages = [Passage(id=i, text=read(i)) for i in sources]
        context = fact_context(state.triples, passages)
        answer = write_answer(generate, state.question, passages, context)
        return answer_update(state, passages, answer)

    return (
        StateGraph(GraphRagState)
        .add_node("retrieve", retrieve)
        .add_node("extract", extract_new)
        .add_node("match", match)
        .add_node("expand", expand)
        .add_node("answer", answer)
        .add_edge("retrieve", "extract")
        .add_edge("extract", "match")
        .add_edge("match", "expand")
        .add_edge("expand", "answer")
        .add_edge("answer", END)
        .compile(**compile_args)
    )
