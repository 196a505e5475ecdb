"""Local lexical retrieval: BM25 over a small corpus of texts, and a tool that searches it.

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
the order the documents were given, so a search is deterministic.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
import pydantic

from agentic_jax.agents.tools.base import Tool, tool

SUFFIXES = (".txt", ".md")
MAX_K = 20


def bm25s():
    """The ``bm25s`` module, imported on first use: importing it initialises JAX's backend, which
    a multi-process job must leave to ``jax.distributed.initialize``."""
    import bm25s as module

    return module


# bm25s sets its own logger to DEBUG, which would print every index build wherever the root
# logger has a handler.
logging.getLogger("bm25s").setLevel(logging.WARNING)


class Hit(NamedTuple):
    id: str
    text: str
    score: float


def _tokens(texts: list[str]) -> list[list[str]]:
    return bm25s().tokenize(
        [unicodedata.normalize("NFKC", t) for t in texts],
        stopwords="en",
        return_ids=False,
        show_progress=False,
    )


def _paragraphs(text: str) -> list[str]:
    """Blank-line-separated paragraphs, each with its lines joined, empty ones dropped."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.strip())
        elif current:
            blocks.append(" ".join(current))
            current = []
    if current:
        blocks.append(" ".join(current))
    return blocks


class Retriever:
    """A BM25 index over ``texts`` (see the module docstring); ``ids`` name the documents
    (default: ``"0"``, ``"1"``, ...).  ``k1`` saturates term frequency, ``b`` normalises for
    document length."""

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
            raise ValueError("Retriever needs at least one document")
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("Retriever documents must be strings")
        ids = [str(i) for i in range(len(texts))] if ids is None else [str(i) for i in ids]
        if len(ids) != len(texts):
            raise ValueError(f"Retriever got {len(ids)} ids for {len(texts)} documents")
        if len(set(ids)) != len(ids):
            raise ValueError("Retriever document ids must be unique")
        self.texts, self.ids, self.k1, self.b = texts, ids, k1, b
        tokens = _tokens(texts)
        self._index = None  # no document has a token: every search comes back empty
        if any(tokens):
            self._index = bm25s().BM25(k1=k1, b=b, method="lucene")
            self._index.index(tokens, show_progress=False)

    @classmethod
    def from_documents(
        cls, texts: Sequence[str], ids: Sequence[str] | None = None, **bm25
    ) -> Retriever:
        return cls(texts, ids, **bm25)

    @classmethod
    def from_path(cls, path: str | Path, **bm25) -> Retriever:
        """A directory: one document per ``.txt``/``.md`` file below it (recursively, in sorted
        order), its id the path relative to the directory.  One file: one document per
        blank-line-separated paragraph, its id ``<file name>#<n>`` (``n`` from 1)."""
        path = Path(path)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
            if not files:
                raise ValueError(f"no {'/'.join(SUFFIXES)} files under {path}")
            return cls(
                [p.read_text(encoding="utf-8") for p in files],
                [p.relative_to(path).as_posix() for p in files],
                **bm25,
            )
        if not path.is_file():
            raise FileNotFoundError(f"no file or directory at {path}")
        paragraphs = _paragraphs(path.read_text(encoding="utf-8"))
        if not paragraphs:
            raise ValueError(f"{path} has no text")
        return cls(paragraphs, [f"{path.name}#{n}" for n in range(1, len(paragraphs) + 1)], **bm25)

    def __len__(self) -> int:
        return len(self.texts)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every document for ``query``, in document order."""
        ids = [] if self._index is None else self._index.get_tokens_ids(_tokens([query])[0])
        if not ids:
            return np.zeros(len(self.texts), np.float32)
        return self._index.get_scores_from_ids(ids)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The (at most) ``k`` best hits for ``query``, best first."""
        if not isinstance(query, str):
            raise TypeError(f"query must be a string, got {type(query).__name__}")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        scores = self.scores(query)
        order = np.argsort(-scores, kind="stable")[:k]
        return [Hit(self.ids[i], self.texts[i], float(scores[i])) for i in order if scores[i] > 0]


def format_hits(hits: Sequence[Hit]) -> str:
    """Hits as the text a model reads: ``[id] (score s) text``, one block each."""
    return "\n\n".join(f"[{h.id}] (score {h.score:.2f}) {h.text}" for h in hits)


def retrieval_tool(retriever: Retriever, name: str = "search", default_k: int = 3) -> Tool:
    """A tool that searches ``retriever``: ``default_k`` hits unless the model asks for another
    number (at most ``MAX_K``)."""
    if not 1 <= default_k <= MAX_K:
        raise ValueError(f"default_k must be in [1, {MAX_K}], got {default_k}")

    def search(query: str, k: Annotated[int, pydantic.Field(ge=1, le=MAX_K)] = default_k) -> str:
        """Search the local document collection by keywords; returns the best matching passages.

        Args:
            query: keywords to look for.
            k: how many passages to return at most.
        """
        hits = retriever.search(query, k)
        return format_hits(hits) if hits else f"no passage matches {query!r}"

    return tool(search, name=name, timeout_s=10)
