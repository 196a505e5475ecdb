"""A search tool over local passages: any ranked index of :mod:`agentic_jax.retrieval` (by
default BM25, :class:`agentic_jax.retrieval.BM25`, whose docstring gives the formula and the
tokenisation; a ``DenseRetriever`` over a trained encoder, a ``FusionRetriever`` for hybrid
search) over a corpus of texts whose passages the tool shows the model.

With BM25 a hit is a passage sharing at least one query token; hits come best first, ties in the
order the passages were given, so a search is deterministic.  The same tool plays in RL rollouts
(``agents.env_tool``, in a ``HostTextEnv``): Search-R1's search engine (Jin et al. 2025,
arXiv:2503.09516) on the host, for indexes that are not jnp functions or do not fit the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, NamedTuple

import numpy as np
import pydantic

from agentic_jax import retrieval
from agentic_jax.agents.tools.base import Tool, tool
from agentic_jax.retrieval.documents import load_documents
from agentic_jax.retrieval.sparse import BM25

SUFFIXES = (".txt", ".md")
MAX_K = 20


class Hit(NamedTuple):
    """A passage as the tool shows it."""

    id: str
    text: str
    score: float


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
    """Passages and an index over them: ``ids`` name the passages (default: ``"0"``, ``"1"``,
    ...); ``index`` is any :class:`agentic_jax.retrieval.Retriever` whose hits are those ids
    (dense, hybrid, reranked), by default BM25 built here with ``bm25`` (``k1``, ``b``)."""

    def __init__(
        self,
        texts: Sequence[str],
        ids: Sequence[str] | None = None,
        *,
        index: retrieval.Retriever | None = None,
        **bm25,
    ):
        if index is not None and (bm25 or ids is None):
            raise ValueError("an index comes with its passages' ids and without BM25 settings")
        self.index = BM25(texts, ids, **bm25) if index is None else index
        self.texts = list(texts)
        self.ids = self.index.ids if index is None else [str(i) for i in ids]
        if len(self.ids) != len(self.texts):
            raise ValueError(f"{len(self.ids)} ids for {len(self.texts)} passages")
        self._text = dict(zip(self.ids, self.texts))

    @classmethod
    def from_documents(
        cls, texts: Sequence[str], ids: Sequence[str] | None = None, **bm25
    ) -> Retriever:
        return cls(texts, ids, **bm25)

    @classmethod
    def from_path(cls, path: str | Path, **bm25) -> Retriever:
        """A directory: one passage per ``.txt``/``.md`` file below it (recursively, in sorted
        order), its id the path relative to the directory.  One file: one passage per
        blank-line-separated paragraph, its id ``<file name>#<n>`` (``n`` from 1)."""
        path = Path(path)
        if path.is_dir():
            documents = load_documents(path, SUFFIXES)
            return cls([d.text for d in documents], [d.id for d in documents], **bm25)
        if not path.is_file():
            raise FileNotFoundError(f"no file or directory at {path}")
        paragraphs = _paragraphs(path.read_text(encoding="utf-8"))
        if not paragraphs:
            raise ValueError(f"{path} has no text")
        return cls(paragraphs, [f"{path.name}#{n}" for n in range(1, len(paragraphs) + 1)], **bm25)

    def __len__(self) -> int:
        return len(self.texts)

    def scores(self, query: str) -> np.ndarray:
        """The BM25 score of every passage for ``query``, in passage order (BM25 indexes only)."""
        return self.index.scores(query)

    def search(self, query: str, k: int = 3) -> list[Hit]:
        """The (at most) ``k`` best passages for ``query``, best first."""
        return [Hit(h.id, self._text[h.id], h.score) for h in self.index.search(query, k)]


def format_hits(hits: Sequence[Hit]) -> str:
    """Hits as the text a model reads: ``[id] (score s) text``, one block each."""
    return "\n\n".join(f"[{h.id}] (score {h.score:.2f}) {h.text}" for h in hits)


def retrieval_tool(retriever: Retriever, name: str = "search", default_k: int = 3) -> Tool:
    """A tool that searches ``retriever`` (passages over any index): ``default_k`` hits unless
    the model asks for another number (at most ``MAX_K``)."""
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
