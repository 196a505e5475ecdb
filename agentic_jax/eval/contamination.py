"""Contamination check: n-gram overlap between evaluation items and a training corpus.

A model that saw a test item during training can score well on it by recall, so a report
should say which items occur in the training data and what the score is on the rest.  The
GPT-3 report (Brown et al. 2020, arXiv:2005.14165, appendix C) flags an item that shares any
13-gram with the corpus; the Llama 2 report (Touvron et al. 2023, arXiv:2307.09288, appendix
A.6) grades items by how much of them such matches cover.  Both give the score on the clean
subset beside the full one, which :func:`clean_subset_score` computes.

Text is normalised before it is split: lowercased, punctuation and symbols deleted, split on
whitespace.  Deleting symbols makes ``3 + 4`` and ``3 * 4`` one text, so an index may keep some
(``symbols="+-*/="``) as tokens of their own, for items that are arithmetic.  The index keeps
one 64-bit hash per distinct gram (a sorted ``uint64`` array, 8 bytes a gram, never the corpus
text): each token is hashed with BLAKE2b (stable across processes, unlike ``hash``) and a
gram's hash chains its tokens' through the SplitMix64 mixer, so a whole document's grams are
hashed in ``n`` vectorised numpy passes.

An item shorter than ``n`` tokens is checked as one gram of all its tokens (the GPT-3 rule).
The index finds such a gram only if it stores grams of that length: built with
``min_n < n`` it stores every gram of ``min_n..n`` tokens (costing ``n − min_n + 1`` times the
memory), otherwise only whole corpus documents shorter than ``min_n`` match a short item.  The
report marks the items shorter than the index's ``min_n`` (``short``) for that reason.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Iterable, Sequence

import numpy as np

_SEED = np.uint64(0x9E3779B97F4A7C15)
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_CONSOLIDATE = 1 << 22  # hashes buffered before they are merged into the sorted set


@functools.lru_cache(maxsize=16)
def _symbol_rules(symbols: str) -> tuple[dict, re.Pattern]:
    """The table that sets each kept symbol apart, and the pattern deleting every other one."""
    if re.search(r"[\w\s]", symbols):
        raise ValueError(f"symbols must be punctuation or symbol characters, got {symbols!r}")
    apart = str.maketrans({c: f" {c} " for c in symbols})
    return apart, re.compile(f"[^\\w\\s{re.escape(symbols)}]|_")


def normalise(text: str, symbols: str = "") -> list[str]:
    """Lowercase, delete punctuation and symbols (``don't`` → ``dont``) except each character
    of ``symbols``, which becomes a token of its own (``"3+4"`` → ``3 + 4``), split on
    whitespace."""
    apart, others = _symbol_rules(symbols)
    return others.sub("", text.lower().translate(apart)).split()


def ngrams(text: str, n: int = 13, symbols: str = "") -> list[tuple[str, ...]]:
    """The ``n``-token windows of ``normalise(text, symbols)``; a text of fewer than ``n``
    tokens is one gram of all of them, and a text with no tokens has none."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    words = normalise(text, symbols)
    if len(words) < n:
        return [tuple(words)] if words else []
    return [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]


@functools.lru_cache(maxsize=1 << 20)
def _token_hash(token: str) -> int:
    return int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest(), "little")


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (a bijection of uint64 that spreads every input bit)."""
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _chain(words: Sequence[str], lengths: range) -> list[np.ndarray]:
    """Hashes of every gram of ``words`` whose length is in ``lengths`` (ascending), one array
    per length that fits; ``h_k[i]`` hashes ``words[i : i + k]``."""
    tokens = np.fromiter((_token_hash(w) for w in words), np.uint64, len(words))
    h = np.full(len(words), _SEED, np.uint64)
    out = []
    with np.errstate(over="ignore"):
        for k in range(1, min(lengths.stop - 1, len(words)) + 1):
            h = _mix(h[: len(words) - k + 1] ^ tokens[k - 1 :])
            if k in lengths:
                out.append(h)
    return out


def _item_hashes(words: Sequence[str], n: int) -> np.ndarray:
    """The hashes of an item's grams: its ``n``-grams, or one gram of all its tokens."""
    if not words:
        return np.zeros(0, np.uint64)
    length = min(n, len(words))
    return _chain(words, range(length, length + 1))[0]


def _distinct(hashes: np.ndarray) -> np.ndarray:
    """The sorted distinct values: sorted, then deduplicated (NumPy 2's ``np.unique`` hashes
    first, some 100 times slower on millions of ``uint64``)."""
    hashes = np.sort(hashes)
    return hashes[np.concatenate(([True], hashes[1:] != hashes[:-1]))] if hashes.size else hashes


@dataclasses.dataclass(frozen=True)
class NgramIndex:
    """The sorted distinct hashes of a corpus's grams of ``min_n..n`` tokens (see the module
    docstring), normalised keeping ``symbols``, built with :meth:`build`."""

    hashes: np.ndarray
    n: int
    min_n: int
    symbols: str = ""

    @classmethod
    def build(
        cls,
        corpus_texts: Iterable[str],
        n: int = 13,
        *,
        min_n: int | None = None,
        symbols: str = "",
    ):
        """Index every gram of ``min_n..n`` tokens (``min_n`` defaults to ``n``) of each
        document, and each document shorter than ``min_n`` as one gram; items are normalised
        the same way, keeping ``symbols`` (see `normalise`)."""
        min_n = n if min_n is None else min_n
        if not 1 <= min_n <= n:
            raise ValueError(f"need 1 <= min_n <= n, got min_n={min_n}, n={n}")
        stored = np.zeros(0, np.uint64)
        pending, buffered = [], 0
        for text in corpus_texts:
            if not isinstance(text, str):
                raise ValueError(f"corpus_texts must hold strings, got {type(text).__name__}")
            words = normalise(text, symbols)
            if not words:
                continue
            low = min(min_n, len(words))
            grams = _chain(words, range(low, n + 1))
            pending.extend(grams)
            buffered += sum(g.size for g in grams)
            if buffered >= _CONSOLIDATE:
                stored = _distinct(np.concatenate([stored, *pending]))
                pending, buffered = [], 0
        return cls(_distinct(np.concatenate([stored, *pending])), n, min_n, symbols)

    def __len__(self) -> int:
        return self.hashes.size

    def _found(self, hashes: np.ndarray) -> np.ndarray:
        at = np.minimum(np.searchsorted(self.hashes, hashes), max(self.hashes.size - 1, 0))
        return self.hashes[at] == hashes if self.hashes.size else np.zeros(hashes.size, bool)

    def overlap(self, text: str) -> float:
        """The fraction of the item's gram windows (counted with repeats) found in the corpus;
        0 for an item with no tokens."""
        hashes = _item_hashes(normalise(text, self.symbols), self.n)
        return float(self._found(hashes).mean()) if hashes.size else 0.0


@dataclasses.dataclass(frozen=True)
class ContaminationReport:
    """Per item: ``overlap`` fraction, ``flagged`` (``overlap > threshold``) and ``short``
    (fewer tokens than the index's ``min_n``, so only a whole corpus document can match it)."""

    overlap: np.ndarray
    flagged: np.ndarray
    short: np.ndarray
    threshold: float
    n: int

    @property
    def n_flagged(self) -> int:
        return int(self.flagged.sum())

    @property
    def fraction_flagged(self) -> float:
        return float(self.flagged.mean()) if self.flagged.size else 0.0


def contamination_report(
    items: Sequence[str], index: NgramIndex, threshold: float = 0.0
) -> ContaminationReport:
    """Check each item against ``index``.  The default ``threshold=0`` flags an item that shares
    any gram with the corpus (GPT-3); e.g. 0.8 flags only items mostly covered by matches."""
    if isinstance(items, str):
        raise ValueError("items must be a sequence of strings, not one string")
    if not 0 <= threshold < 1:
        raise ValueError(f"threshold must be in [0, 1), got {threshold}")
    overlap = np.array([index.overlap(item) for item in items], np.float64)
    short = np.array([len(normalise(item, index.symbols)) < index.min_n for item in items], bool)
    return ContaminationReport(overlap, overlap > threshold, short, threshold, index.n)


def clean_subset_score(scores, flags) -> tuple[float, float, float]:
    """``(all, clean, contaminated)``: the mean score over every item, over the unflagged and
    over the flagged ones (NaN for an empty subset)."""
    scores = np.asarray(scores, np.float64)
    flags = np.asarray(flags)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {scores.shape}")
    if flags.shape != scores.shape:
        raise ValueError(f"flags must have the shape of scores {scores.shape}, got {flags.shape}")
    if flags.dtype != bool:
        raise ValueError(f"flags must be booleans, got {flags.dtype}")

    def mean(values: np.ndarray) -> float:
        return float(values.mean()) if values.size else float("nan")

    return mean(scores), mean(scores[~flags]), mean(scores[flags])
