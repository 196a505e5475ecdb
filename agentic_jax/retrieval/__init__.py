"""Retrieval for retrieval-augmented generation: documents and chunkers, indexes, encoders trained
in JAX, fusion and reranking (see docs/retrieval.md)."""

from agentic_jax.retrieval.approximate import ApproximateIndex  # usearch imported when used
from agentic_jax.retrieval.chunking import (
    Chunk,
    Chunker,
    FixedSizeChunker,
    ParentChildChunker,
    RecursiveChunker,
    SemanticChunker,
    chunk_documents,
    sentence_spans,
)
from agentic_jax.retrieval.dense import DenseIndex, DenseRetriever, exact_top_k
from agentic_jax.retrieval.documents import Document, load_documents
from agentic_jax.retrieval.fusion import (
    RRF_K,
    FusionRetriever,
    HyDE,
    MultiQueryRetriever,
    as_generator,
    parse_queries,
    reciprocal_rank_fusion,
)
from agentic_jax.retrieval.retriever import Hit, ParentRetriever, Retriever
from agentic_jax.retrieval.sparse import BM25

__all__ = [
    "BM25",
    "RRF_K",
    "ApproximateIndex",
    "Chunk",
    "Chunker",
    "DenseIndex",
    "DenseRetriever",
    "Document",
    "FixedSizeChunker",
    "FusionRetriever",
    "Hit",
    "HyDE",
    "MultiQueryRetriever",
    "ParentChildChunker",
    "ParentRetriever",
    "RecursiveChunker",
    "Retriever",
    "SemanticChunker",
    "as_generator",
    "chunk_documents",
    "exact_top_k",
    "load_documents",
    "parse_queries",
    "reciprocal_rank_fusion",
    "sentence_spans",
]
