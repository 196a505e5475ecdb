"""Retrieval-augmented generation's control flows, each a checkpointed state graph
(``agents.loops.graph``) over a ``retrieval.Retriever``, a chunk-text lookup and a generator:
standard RAG with citations, Self-RAG, corrective RAG, adaptive RAG, Graph RAG and multi-source
routing (see docs/retrieval.md).  ``build_<flow>(...)`` returns the compiled graph, which
``run(graph, question)`` runs to its final state; the builders are gin configurables
(``rag.build_corrective_rag.max_retries = 3``)."""

from agentic_jax.agents.rag.adaptive import AdaptiveState, build_adaptive_rag
from agentic_jax.agents.rag.common import Answer, Passage, RagState, parse_citations, run
from agentic_jax.agents.rag.corrective import Attempt, CorrectiveState, build_corrective_rag
from agentic_jax.agents.rag.graph_rag import GraphRagState, build_graph_rag, index_chunks
from agentic_jax.agents.rag.multi_source import MultiSourceState, Source, build_multi_source_rag
from agentic_jax.agents.rag.self_rag import Candidate, SelfRagState, build_self_rag
from agentic_jax.agents.rag.standard import build_standard_rag

__all__ = [
    "AdaptiveState",
    "Answer",
    "Attempt",
    "Candidate",
    "CorrectiveState",
    "GraphRagState",
    "MultiSourceState",
    "Passage",
    "RagState",
    "SelfRagState",
    "Source",
    "build_adaptive_rag",
    "build_corrective_rag",
    "build_graph_rag",
    "build_multi_source_rag",
    "build_self_rag",
    "build_standard_rag",
    "index_chunks",
    "parse_citations",
    "run",
]
