"""Cutting documents into chunks that keep where they came from.

Every chunker here computes character spans ``[start, end)`` of a text, and a chunk's text is
``document.text[start:end]``: offsets are exact, so a hit can be highlighted in its source and
neighbouring chunks can be stitched back together.  The span chunkers cover the whole text (a
fixed-size chunker's neighbours also share its configured overlap), so nothing of a document is
lost to retrieval.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import itertools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import gin
import numpy as np

from agentic_jax.retrieval.documents import Document

Span = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Chunk:
    """``document_id``'s text from ``start`` to ``end`` (characters); ``parent_id`` names the
    larger chunk it was cut from (parent-child chunking), else None."""

    id: str
    document_id: str
    text: str
    start: int
    end: int
    source: str = ""
    parent_id: str | None = None
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class TokenizerLike(Protocol):
    """Anything with ``encode`` and ``decode``, e.g. ``agentic_jax.data.Tokenizer``."""

    def encode(self, text: str) -> Sequence[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class Chunker(abc.ABC):
    """Cuts a text into spans; ``chunk`` makes them a document's chunks, ids ``<document>#<n>``
    (``n`` from 0)."""

    @abc.abstractmethod
    def spans(self, text: str) -> list[Span]:
        """The chunks' ``[start, end)`` character spans, in order."""

    def chunk(self, document: Document) -> list[Chunk]:
        return _chunks(document, self.spans(document.text), f"{document.id}#")


def _chunks(document: Document, spans: Iterable[Span], prefix: str, parent_id=None) -> list[Chunk]:
    return [
        Chunk(
            f"{prefix}{n}",
            document.id,
            document.text[start:end],
            start,
            end,
            document.source,
            parent_id,
            document.metadata,
        )
        for n, (start, end) in enumerate(spans)
    ]


def chunk_documents(documents: Iterable[Document], chunker: Chunker) -> list[Chunk]:
    return [chunk for document in documents for chunk in chunker.chunk(document)]


@gin.configurable(module="retrieval")
class FixedSizeChunker(Chunker):
    """Windows of ``size`` tokens, each starting ``overlap`` tokens before its predecessor ends.

    Token boundaries become character offsets: with no tokenizer, tokens are runs of
    non-whitespace and a boundary is the start of a token (a token owns the whitespace after
    it).  With a tokenizer, the boundary before token ``t`` is ``len(decode(ids[:t]))``:
    decoding whole prefixes is exact for every tokenizer that round-trips text, where decoding
    tokens one by one is not (SentencePiece drops a lone piece's leading space).  It costs
    ``O(n² / (size - overlap))`` decoded tokens for ``n`` tokens of text.  A prefix whose
    decoding is not a prefix of the text ends inside a character (byte-level BPE splits UTF-8
    sequences): a window's end then moves to the next character boundary, its start back to the
    previous one (a longer overlap), or forward where going back would leave the window ending
    no further than its predecessor.
    """

    def __init__(self, size: int = 256, overlap: int = 32, tokenizer: TokenizerLike | None = None):
        if not 0 <= overlap < size:
            raise ValueError(f"need 0 <= overlap < size, got overlap {overlap}, size {size}")
        self.size, self.overlap, self.tokenizer = size, overlap, tokenizer

    def _offsets(self, text: str) -> tuple[int, Callable[[int], int | None]]:
        """The number of tokens ``n`` and ``offset(t)``: the character offset of the boundary
        before token ``t`` (``0 <= t <= n``), None inside a character."""
        if self.tokenizer is None:
            starts = [m.start() for m in re.finditer(r"\S+", text)]
            offsets = [0, *starts[1:], len(text)]
            return len(starts), offsets.__getitem__
        ids = list(self.tokenizer.encode(text))
        if self.tokenizer.decode(ids) != text:
            raise ValueError("the tokenizer does not give the text back from its tokens")

        @functools.cache
        def offset(t: int) -> int | None:
            prefix = self.tokenizer.decode(ids[:t])
            return len(prefix) if text.startswith(prefix) else None

        return len(ids), offset

    def spans(self, text: str) -> list[Span]:
        n, offset = self._offsets(text)
        spans, first = [], 0
        while n:
            last = next(u for u in range(min(first + self.size, n), n + 1) if offset(u) is not None)
            spans.append((offset(first), offset(last)))
            if last == n:
                break
            # Back from `last - overlap` while the next window would still end past `last`,
            # then forward.
            t = last - self.overlap
            starts = itertools.chain(
                range(t, max(first, last - self.size), -1), range(t + 1, last + 1)
            )
            first = next(u for u in starts if offset(u) is not None)
        return spans


# Where structure lets a text be cut, coarsest first: before a Markdown heading, after a blank
# line (paragraphs), after a line break, after a sentence's end, after whitespace (words).  A cut
# goes after the whitespace that follows, so no piece is whitespace alone.
HEADING = r"(?m)^(?=#{1,6}[ \t])"
PARAGRAPH = r"\n[ \t]*\n\s*"
SENTENCE = r"[.!?]+[\"')\]]*\s+"
LEVELS = tuple(re.compile(p) for p in (HEADING, PARAGRAPH, r"\n\s*", SENTENCE, r"\s+"))
SENTENCES = re.compile(f"{PARAGRAPH}|{SENTENCE}")


def _cuts(pattern: re.Pattern, text: str, start: int, end: int) -> list[int]:
    """``start``, every cut strictly inside ``[start, end)`` (a match's end), and ``end``."""
    inner = {m.end() for m in pattern.finditer(text, start, end)} - {start, end}
    return [start, *sorted(inner), end]


@gin.configurable(module="retrieval")
class RecursiveChunker(Chunker):
    """Chunks of at most ``max_size`` (by ``length``: characters, or a token count), cut along
    the coarsest structure that fits: Markdown sections, then paragraphs, lines, sentences,
    words, and characters as a last resort.  Neighbouring pieces of one level are merged while
    they fit, so chunks are near the limit rather than one per sentence.  ``length`` must not
    shrink when text is appended."""

    def __init__(self, max_size: int = 1000, length: Callable[[str], int] = len):
        if max_size < 1:
            raise ValueError(f"max_size must be at least 1, got {max_size}")
        self.max_size, self.length = max_size, length

    def _fits(self, text: str, start: int, end: int) -> bool:
        return self.length(text[start:end]) <= self.max_size

    def spans(self, text: str) -> list[Span]:
        return self._split(text, 0, len(text), 0) if text else []

    def _split(self, text: str, start: int, end: int, level: int) -> list[Span]:
        if self._fits(text, start, end):
            return [(start, end)]
        if level == len(LEVELS):
            return self._characters(text, start, end)
        pieces = list(itertools.pairwise(_cuts(LEVELS[level], text, start, end)))
        spans, (first, last) = [], pieces[0]
        for piece_start, piece_end in pieces[1:]:
            if self._fits(text, first, piece_end):
                last = piece_end
            else:
                spans += self._split(text, first, last, level + 1)
                first, last = piece_start, piece_end
        return spans + self._split(text, first, last, level + 1)

    def _characters(self, text: str, start: int, end: int) -> list[Span]:
        spans = []
        while start < end:
            stop = start + 1
            if not self._fits(text, start, stop):
                raise ValueError(f"the character {text[start]!r} alone exceeds max_size")
            while stop < end and self._fits(text, start, stop + 1):
                stop += 1
            spans.append((start, stop))
            start = stop
        return spans


def sentence_spans(text: str) -> list[Span]:
    """Sentences and paragraphs, each keeping the whitespace after it, covering ``text``."""
    if not text:
        return []
    return list(itertools.pairwise(_cuts(SENTENCES, text, 0, len(text))))


@gin.configurable(module="retrieval")
class SemanticChunker(Chunker):
    """Sentences grouped by topic: a chunk ends where neighbouring sentences stop resembling
    each other (semantic chunking, G. Kamradt, "5 Levels of Text Splitting", 2024; LangChain's
    ``SemanticChunker``).  With ``e_i = embed(sentence_i)`` and
    ``sim_i = cos(e_i, e_{i+1})``, the text is cut between sentences ``i`` and ``i+1`` where
    ``sim_i < threshold``, or, with ``percentile`` instead, where ``sim_i`` is below that
    percentile (linear interpolation) of the document's ``sim``s.  ``embed`` maps a list of
    strings to an ``[n, d]`` array: any encoder plugs in."""

    def __init__(
        self,
        embed: Callable[[list[str]], Any],
        threshold: float | None = None,
        percentile: float | None = None,
    ):
        if (threshold is None) == (percentile is None):
            raise ValueError("give exactly one of threshold and percentile")
        self.embed, self.threshold, self.percentile = embed, threshold, percentile

    def spans(self, text: str) -> list[Span]:
        sentences = sentence_spans(text)
        if len(sentences) < 2:
            return sentences
        vectors = np.asarray(self.embed([text[s:e] for s, e in sentences]), np.float64)
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        similarity = np.sum(vectors[:-1] * vectors[1:], axis=1)
        limit = self.threshold
        if limit is None:
            limit = np.percentile(similarity, self.percentile)
        ends = [e for (_, e), sim in zip(sentences, similarity) if sim < limit]
        return list(itertools.pairwise([0, *ends, len(text)]))


@gin.configurable(module="retrieval")
class ParentChildChunker:
    """Parent-child (small-to-big) chunking: ``parent`` cuts the document into large chunks,
    ``child`` cuts each parent into small ones (ids ``<parent id>.<n>``, ``parent_id`` set,
    offsets into the document).  Index the children, and return their parents with
    :class:`~agentic_jax.retrieval.retriever.ParentRetriever`."""

    def __init__(self, parent: Chunker, child: Chunker):
        self.parent, self.child = parent, child

    def chunk(self, document: Document) -> tuple[list[Chunk], list[Chunk]]:
        """The document's parents and children."""
        parents = self.parent.chunk(document)
        children = [
            child
            for parent in parents
            for child in _chunks(
                document,
                [(parent.start + s, parent.start + e) for s, e in self.child.spans(parent.text)],
                f"{parent.id}.",
                parent.id,
            )
        ]
        return parents, children
