"""Lexical retrieval: BM25 over a corpus of texts.

Scoring is Okapi BM25 (Robertson & Zaragoza 2009, *The Probabilistic Relevance Framework: BM25
and Beyond*) in Lucene's variant, computed by ``bm25s``: for a query of tokens ``q_1..q_n``
(repeated tokens count again) and a document ``D`` of ``|D|`` tokens,

    score(D) = sum_i idf(q_i) * tf(q_i, D) / (tf(q_i, D) + k1 * (1 - b + b * |D| / avgdl))
    idf(t)   = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

with ``N`` documents, ``df(t)`` of them containing ``t`` and ``avgdl`` the mean document length.
Text is NFKC-normalised, so that a composed ``é`` (as typed) and a decomposed one (as macOS
stores file names, and some editors text) are the same letter, then tokenised by ``bm25s`` alone,
with no downloads: lower-cased runs of two or more word characters, English stop words (a list
shipped inside ``bm25s``) removed, no stemming.

A hit is a document sharing at least one query token (score > 0); hits come best first, ties in
the order the documents were given, so a search is deterministic.  The index is immutable (as
``bm25s``'s is): to change the corpus, build a new one.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence

import gin
import numpy as np

from agentic_jax.retrieval.retriever import Hit, check_k, ranked


def bm25s():
    """The ``bm25s`` module, imported on first use: importing it initialises JAX's backend, which
    a multi-process job must leave to ``jax.distributed.initialize``."""
    import bm25s as module

    # Importing bm25s sets its logger to DEBUG, which would print every index build wherever the
    # root logger has a handler.
    logging.getLogger("bm25s").setLevel(logging.WARNING)
    return module


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s().tokenize(
        [unicodedata.normalize("NFKC", t) for t in texts],
        stopwords="en",
        return_ids=False,
        show_progress=False,
    )


@gin.configurable(module="retrieval")
class BM25:
    """A BM25 index over ``texts`` (see the module docstring); ``ids`` name them (default:
    ``"0"``, ``"1"``, ...).  ``k1`` saturates term frequency, ``b`` normalises for document
    length."""

    def __init__(
        self,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        *,
        k1: float = 1.5,
        b: float = 0.75,
    ):
        texts = list(texts)
        if not texts:
            raise ValueError("BM25 needs at least one document")
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("BM25 documents must be strings")
        ids = [str(i) for i in range(len(texts))] if ids is None else [str(i) for i in ids]
        if len(ids) != len(texts):
            raise ValueError(f"BM25 got {len(ids)} ids for {len(texts)} documents")
        if len(set(ids)) != len(ids):
            raise ValueError("BM25 document ids must be unique")
        self.ids, self.k1, self.b = ids, k1, b
        tokens = _tokens(texts)
        self._index = None  # no document has a token: every search comes back empty
        if any(tokens):
            self._index = bm25s().BM25(k1=k1, b=b, method="lucene")
            self._index.index(tokens, show_progress=False)

    def __len__(self) -> int:
        return len(self.ids)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every document for ``query``, in document order."""
        ids = [] if self._index is None else self._index.get_tokens_ids(_tokens([query])[0])
        if not ids:
            return np.zeros(len(self.ids), np.float32)
        return self._index.get_scores_from_ids(ids)

    def search(self, query: str, k: int) -> list[Hit]:
        """The (at most) ``k`` best hits for ``query``, best first."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        check_k(k)
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:k]
        return ranked((self.ids[i], scores[i]) for i in order if scores[i] > 0)
