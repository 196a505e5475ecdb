"""Combining rankings, and retrieving for queries a generator wrote.

Reciprocal rank fusion needs only ranks, so it fuses retrievers whose scores are not comparable
(BM25's against a cosine).  The query methods call a generator: any ``str -> str`` callable, or a
policy-like object with ``respond(messages)`` (an ``agents`` policy; a scripted one in tests).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import gin
import numpy as np

from agentic_jax.data.chat import Message
from agentic_jax.retrieval.dense import DenseRetriever
from agentic_jax.retrieval.retriever import Hit, Retriever, check_k, ranked

RRF_K = 60

RAG_FUSION_PROMPT = (
    "Write {n} different search queries that would find information to answer the question "
    "below, one per line, nothing else.\n\nQuestion: {query}"
)
REWRITE_PROMPT = (
    "Rewrite the question below as one search query for a document search engine. Answer with "
    "the query alone.\n\nQuestion: {query}"
)
HYDE_PROMPT = "Write a short passage that answers the question.\n\nQuestion: {query}\n\nPassage:"


def reciprocal_rank_fusion(rankings: Sequence[Sequence[Hit | str]], k: int = RRF_K) -> list[Hit]:
    """Reciprocal rank fusion (Cormack, Clarke & Büttcher 2009, *Reciprocal Rank Fusion
    outperforms Condorcet and individual Rank Learning Methods*): a chunk ranked ``r_i`` (from 1)
    by ranking ``i`` scores ``sum_i 1 / (k + r_i)`` over the rankings that hold it; ``k = 60``
    damps the weight of the very top ranks.  Rankings are lists of hits or ids, best first.
    Sums are exactly rounded (``math.fsum``), so equal rank profiles score equally; ties go to
    the chunk met first reading the rankings rank by rank (every ranking's first, then every
    ranking's second, ...)."""
    terms: dict[str, list[float]] = {}
    for position in range(max(map(len, rankings), default=0)):
        for ranking in rankings:
            if position < len(ranking):
                item = ranking[position]
                chunk = item.id if isinstance(item, Hit) else item
                terms.setdefault(chunk, []).append(1 / (k + position + 1))
    scores = {chunk: math.fsum(t) for chunk, t in terms.items()}
    return ranked(sorted(scores.items(), key=lambda item: -item[1]))


@gin.configurable(module="retrieval")
class FusionRetriever:
    """Hybrid search: each retriever's ``depth`` best (default: ``k``), fused by RRF with
    constant ``rrf_k``."""

    def __init__(
        self, retrievers: Sequence[Retriever], depth: int | None = None, rrf_k: int = RRF_K
    ):
        self.retrievers, self.depth, self.rrf_k = list(retrievers), depth, rrf_k

    def search(self, query: str, k: int) -> list[Hit]:
        check_k(k)
        rankings = [r.search(query, self.depth or k) for r in self.retrievers]
        return reciprocal_rank_fusion(rankings, self.rrf_k)[:k]


def as_generator(source, **sampling: Any) -> Callable[[str], str]:
    """A ``prompt -> text`` function from a callable, or from an object with a policy's
    ``respond(messages, **sampling)`` (the prompt is one user message)."""
    if hasattr(source, "respond"):
        return lambda prompt: source.respond([Message("user", prompt)], **sampling).text
    if not callable(source):
        raise TypeError(f"a generator is a callable or has respond(), got {type(source).__name__}")
    return source


_LIST_MARKER = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s*")


def parse_queries(text: str) -> list[str]:
    """One query per non-blank line, list markers (``1.``, ``2)``, ``-``, ``*``) stripped,
    repeats dropped."""
    lines = (_LIST_MARKER.sub("", line).strip() for line in text.splitlines())
    return list(dict.fromkeys(line for line in lines if line))


@gin.configurable(module="retrieval")
class MultiQueryRetriever:
    """Retrieval for generated queries, fused by reciprocal rank fusion.

    RAG-Fusion (Z. Rackauckas 2024, *RAG-Fusion: a New Take on Retrieval-Augmented Generation*,
    arXiv:2402.03367) is the default: the generator writes up to ``n`` sub-queries (one per
    line), each and the original are searched ``depth`` deep (default: ``k``), and the rankings
    are fused by RRF.  Multi-query retrieval is the same with another ``prompt``; query rewriting
    (Ma et al. 2023, *Query Rewriting for Retrieval-Augmented Large Language Models*) is
    ``n=1, include_original=False, prompt=REWRITE_PROMPT``.  ``prompt`` is formatted with
    ``query`` and ``n``.
    """

    def __init__(
        self,
        retriever: Retriever,
        generate,
        n: int = 4,
        include_original: bool = True,
        prompt: str = RAG_FUSION_PROMPT,
        depth: int | None = None,
        rrf_k: int = RRF_K,
    ):
        self.retriever, self.generate = retriever, as_generator(generate)
        self.n, self.include_original, self.prompt = n, include_original, prompt
        self.depth, self.rrf_k = depth, rrf_k

    def queries(self, query: str) -> list[str]:
        """The queries searched for ``query``: the original first if included, then the
        generated ones."""
        generated = parse_queries(self.generate(self.prompt.format(query=query, n=self.n)))
        queries = [query] if self.include_original else []
        return list(dict.fromkeys(queries + generated[: self.n]))

    def search(self, query: str, k: int) -> list[Hit]:
        check_k(k)
        rankings = [self.retriever.search(q, self.depth or k) for q in self.queries(query)]
        return reciprocal_rank_fusion(rankings, self.rrf_k)[:k]


@gin.configurable(module="retrieval")
class HyDE:
    """Hypothetical document embeddings (Gao, Ma, Lin & Callan 2022, *Precise Zero-Shot Dense
    Retrieval without Relevance Labels*, arXiv:2212.10496): the generator writes ``n`` passages
    answering the query, and the index is searched with the mean of their embeddings and (with
    ``include_query``, as in the paper) the query's, ``v = (sum_j f(d_j) + f(q)) / (n + 1)``.  A
    generated answer, even a wrong one, looks more like the relevant passages than the question
    does.  ``prompt`` is formatted with ``query``."""

    def __init__(
        self,
        retriever: DenseRetriever,
        generate,
        n: int = 1,
        include_query: bool = True,
        prompt: str = HYDE_PROMPT,
    ):
        self.retriever, self.generate = retriever, as_generator(generate)
        self.n, self.include_query, self.prompt = n, include_query, prompt

    def texts(self, query: str) -> list[str]:
        """What is embedded for ``query``: the generated passages, then the query if included."""
        passages = [self.generate(self.prompt.format(query=query)) for _ in range(self.n)]
        return passages + [query] * self.include_query

    def search(self, query: str, k: int) -> list[Hit]:
        vectors = np.asarray(self.retriever.encode(self.texts(query)), np.float32)
        return self.retriever.index.search_embeddings(vectors.mean(0, keepdims=True), k)[0]
