"""Retrieval training data made here, from the shipped corpus or any documents, with no download.

* **Passages**: the documents cut by ``chunking.RecursiveChunker`` (at most ``max_chars``
  characters), repeated texts kept once.  A passage is held out when the SHA-256 of its text is
  0 modulo ``heldout_every``: the splits are disjoint by passage and do not depend on order.
* **Queries**, each labelled with the one passage it was made from:

  - ``"sentence"``: the inverse cloze task (Lee, Chang & Toutanova 2019, "Latent Retrieval for
    Weakly Supervised Open Domain Question Answering", arXiv:1906.00300): a sentence of the
    passage (``min_words`` to 40 words) asks for the rest of it.  The sentence is cut out of its
    passage, so that matching it takes more than repeating its words (ICT cuts it 90% of the
    time); the split keeps the cut passage, for training and held-out search alike.  A passage
    that would be left with fewer than ``min_words`` words keeps its sentences and asks none.
  - ``"title"``: a document's title (its first line: a dotted name, a documentation topic, a
    Markdown heading) asks for the document's first passage, where no other document of the
    split has that title.

* **Hard negatives** (as in DPR, Karpukhin et al. 2020, arXiv:2004.04906): ``"bm25"``, the
  passages of the split that BM25 (``sparse.BM25``) ranks highest for the query, its positive
  left out; ``"document"``, other passages of the positive's document.  Lists that come up short
  are filled with random passages.  A passage that holds a sentence query word for word (the
  corpus repeats some text) answers it better than its positive, so it is never that query's
  negative; other BM25 neighbours may still be relevant (false negatives), and the encoder's
  loss masks only repeats of a positive.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Sequence

import gin
import numpy as np

from agentic_jax.data.corpus import corpus_files
from agentic_jax.data.documents import read_documents
from agentic_jax.retrieval.chunking import RecursiveChunker, sentence_spans
from agentic_jax.retrieval.documents import Document, load_documents
from agentic_jax.retrieval.sparse import BM25

KINDS = ("sentence", "title")
NEGATIVES = ("bm25", "document")
MAX_QUERY_WORDS = 40


@dataclasses.dataclass(frozen=True, eq=False)
class RetrievalSplit:
    """Passages, queries and labels of one split: ``positives [Q]`` and ``hard_negatives [Q, H]``
    index ``passages``; ``documents`` names each passage's document, ``kinds`` each query's
    template."""

    passages: tuple[str, ...]
    documents: tuple[str, ...]
    queries: tuple[str, ...]
    kinds: tuple[str, ...]
    positives: np.ndarray
    hard_negatives: np.ndarray


def is_heldout(text: str, every: int) -> bool:
    """Whether ``text`` is held out: the SHA-256 of its text is 0 modulo ``every``.  A hash, not a
    position, so a split does not depend on the order or number of the texts around it."""
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) % every == 0


def title_of(text: str) -> str | None:
    """A document's first line as a title (Markdown ``#`` marks dropped), or None when it reads
    as prose: longer than 100 characters or ending a sentence."""
    line = text.strip().split("\n", 1)[0].strip().lstrip("#").strip()
    if not line or len(line) > 100 or line.endswith((".", ":")):
        return None
    return line


def _passages(
    documents: Sequence[Document], max_chars: int, min_words: int
) -> tuple[list[str], list[str]]:
    """``(texts, document ids)`` of the documents' chunks, stripped, each text once; chunks
    shorter than ``min_words`` words (a lone heading) are dropped."""
    chunker, seen, texts, owners = RecursiveChunker(max_size=max_chars), set(), [], []
    for document in documents:
        for chunk in chunker.chunk(document):
            text = chunk.text.strip()
            if len(text.split()) >= min_words and text not in seen:
                seen.add(text)
                texts.append(text)
                owners.append(document.id)
    return texts, owners


def _cloze(passage: str, count: int, min_words: int, rng) -> tuple[list[str], str]:
    """Up to ``count`` sentences of ``passage`` (``min_words`` to 40 words each) and the passage
    without them; no sentence when fewer than ``min_words`` words would be left."""
    spans = sentence_spans(passage)
    usable = [
        i
        for i, (s, e) in enumerate(spans)
        if min_words <= len(passage[s:e].split()) <= MAX_QUERY_WORDS
    ]
    chosen = set(rng.permutation(usable)[:count].tolist())
    rest = "".join(passage[s:e] for i, (s, e) in enumerate(spans) if i not in chosen).strip()
    if len(rest.split()) < min_words:
        return [], passage
    return [" ".join(passage[s:e].split()) for i, (s, e) in enumerate(spans) if i in chosen], rest


def _queries(
    passages: list[str],
    titles: dict[str, str],
    kinds: Sequence[str],
    queries_per_passage: int,
    min_words: int,
    seed: int,
) -> tuple[list[tuple[str, str, int]], list[str]]:
    """``(query, kind, positive)`` triples of one split and its passages, cut where they gave
    sentence queries; ``titles`` maps a document's first passage to the document's title."""
    out = []
    if "title" in kinds:
        named = [(titles[p], index) for index, p in enumerate(passages) if p in titles]
        counts = collections.Counter(title for title, _ in named)
        out += [(title, "title", index) for title, index in named if counts[title] == 1]
    if "sentence" in kinds:
        cut = []
        for index, passage in enumerate(passages):
            rng = np.random.default_rng([seed, index])
            sentences, rest = _cloze(passage, queries_per_passage, min_words, rng)
            out += [(sentence, "sentence", index) for sentence in sentences]
            cut.append(rest)
        passages = cut
    return out, passages


def _hard_negatives(
    passages: list[str],
    owners: list[str],
    queries: list[tuple[str, str, int]],
    count: int,
    negatives: str,
    seed: int,
) -> np.ndarray:
    """``[Q, count]`` passage indices near each query and not its positive (module docstring)."""
    if len(passages) <= count:
        raise ValueError(f"a split of {len(passages)} passages cannot give {count} hard negatives")
    index = BM25(passages) if negatives == "bm25" else None
    by_document = {}
    for i, owner in enumerate(owners):
        by_document.setdefault(owner, []).append(i)
    flat = [" ".join(p.split()) for p in passages]
    out = np.zeros((len(queries), count), np.int32)
    for row, (query, kind, positive) in enumerate(queries):
        if index is not None:
            scores = index.scores(query)
            near = [int(i) for i in np.argsort(-scores, kind="stable") if scores[i] > 0]
        else:
            near = by_document[owners[positive]]

        def negative(i: int, query=query, kind=kind, positive=positive) -> bool:
            return i != positive and not (kind == "sentence" and query in flat[i])

        chosen = [i for i in near if negative(i)][:count]
        shuffled = np.random.default_rng([seed, row]).permutation(len(passages)).tolist()
        chosen += [i for i in shuffled if negative(i) and i not in chosen][: count - len(chosen)]
        if len(chosen) < count:
            raise ValueError(f"the query {query!r} has fewer than {count} possible negatives")
        out[row] = chosen
    return out


def make_splits(
    documents: Sequence[Document],
    *,
    max_chars: int = 400,
    kinds: Sequence[str] = KINDS,
    queries_per_passage: int = 1,
    min_words: int = 5,
    hard_negatives: int = 3,
    negatives: str = "bm25",
    heldout_every: int = 10,
    seed: int = 0,
) -> dict[str, RetrievalSplit]:
    """``{"train": ..., "heldout": ...}`` made from ``documents`` (see the module docstring)."""
    if unknown := set(kinds) - set(KINDS):
        raise ValueError(f"unknown query kinds {sorted(unknown)}; expected some of {KINDS}")
    if negatives not in NEGATIVES:
        raise ValueError(f"negatives={negatives!r}; expected one of {NEGATIVES}")
    texts, owners = _passages(documents, max_chars, min_words)
    leads, titles = {}, {}
    for text, owner in zip(texts, owners):
        leads.setdefault(owner, text)
    for document in documents:
        title = title_of(document.text)
        if title and document.id in leads:
            titles.setdefault(leads[document.id], title)
    held = [is_heldout(t, heldout_every) for t in texts]
    splits = {}
    for name, keep in (("train", False), ("heldout", True)):
        rows = [i for i, h in enumerate(held) if h == keep]
        passages, passage_docs = [texts[i] for i in rows], [owners[i] for i in rows]
        queries, passages = _queries(passages, titles, kinds, queries_per_passage, min_words, seed)
        if not queries:
            raise ValueError(f"the {name} split has no queries: give more documents")
        splits[name] = RetrievalSplit(
            passages=tuple(passages),
            documents=tuple(passage_docs),
            queries=tuple(q for q, _, _ in queries),
            kinds=tuple(k for _, k, _ in queries),
            positives=np.asarray([p for _, _, p in queries], np.int32),
            hard_negatives=_hard_negatives(
                passages, passage_docs, queries, hard_negatives, negatives, seed
            ),
        )
    return splits


def corpus_documents(split: str = "train") -> list[Document]:
    """The shipped corpus's documents (``data.corpus``), ids ``corpus/<split>#<n>``."""
    return [
        Document(f"corpus/{split}#{n}", text, f"corpus/{split}")
        for n, text in enumerate(read_documents(corpus_files(split)))
    ]


@gin.configurable(module="retrieval")
@dataclasses.dataclass(frozen=True)
class RetrievalDataSpec:
    """Where a retrieval trainer's data comes from: the documents under ``path``
    (``documents.load_documents``), else the shipped corpus's training documents, the first
    ``max_documents`` of them; the other fields are :func:`make_splits`'."""

    path: str | None = None
    max_documents: int | None = 300
    max_chars: int = 400
    kinds: tuple[str, ...] = KINDS
    queries_per_passage: int = 1
    min_words: int = 5
    hard_negatives: int = 3
    negatives: str = "bm25"
    heldout_every: int = 10
    seed: int = 0

    def documents(self) -> list[Document]:
        documents = corpus_documents() if self.path is None else load_documents(self.path)
        return documents[: self.max_documents]

    def splits(self) -> dict[str, RetrievalSplit]:
        fields = dataclasses.asdict(self)
        del fields["path"], fields["max_documents"]
        return make_splits(self.documents(), **fields)
