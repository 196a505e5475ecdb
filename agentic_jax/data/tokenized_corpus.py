"""Text files tokenized once into a flat token array, optionally cached on disk.

Tokenizing the shipped corpus takes a few seconds; the cache (an ``.npz`` keyed by the
tokenizer's fingerprint and the files' contents) makes later start-ups load it in milliseconds
and can never go stale, because any change to the tokenizer or the text changes the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import pathlib
from collections.abc import Sequence

import numpy as np

from agentic_jax.data.documents import read_documents
from agentic_jax.data.tokenizer import Tokenizer
from agentic_jax.files import atomic_write

_CACHE_FORMAT = 1


@dataclasses.dataclass(frozen=True)
class TokenizedCorpus:
    """Documents as ``BOS ... EOS`` runs: document i is ``tokens[offsets[i]:offsets[i + 1]]``."""

    tokens: np.ndarray  # int32 [total_tokens]
    offsets: np.ndarray  # int64 [num_docs + 1]

    @property
    def num_docs(self) -> int:
        return len(self.offsets) - 1

    def chunk_bounds(self, max_len: int) -> np.ndarray:
        """``[n, 2]`` (start, end) pieces of at most ``max_len`` tokens covering every document.

        Consecutive pieces of a document overlap by one token, so each next-token pair
        (``tokens[i]`` -> ``tokens[i + 1]``) lies in exactly one piece: nothing is lost to
        splitting and nothing is trained on twice.
        """
        if max_len < 2:
            raise ValueError("max_len must be at least 2 (one input and one target)")
        starts, ends = self.offsets[:-1], self.offsets[1:]
        step = max_len - 1
        pieces = np.maximum(1, -(-(ends - starts - 1) // step))  # ceil((n - 1) / step)
        doc = np.repeat(np.arange(self.num_docs), pieces)
        first_piece = np.repeat(np.cumsum(pieces) - pieces, pieces)
        piece_starts = starts[doc] + (np.arange(len(doc)) - first_piece) * step
        return np.stack([piece_starts, np.minimum(piece_starts + max_len, ends[doc])], axis=1)


def _cache_key(tokenizer: Tokenizer, files: Sequence[str | os.PathLike]) -> str:
    """Covers everything the cached tokens depend on.  The fingerprint covers the vocabulary and
    merges only, while the BOS/EOS ids added to every document come from the wrapper (e.g. a
    ``tokenizer_config.json`` naming another EOS), so they are part of the key too."""
    file_hashes = [hashlib.sha256(pathlib.Path(f).read_bytes()).hexdigest() for f in files]
    payload = json.dumps(
        {
            "format": _CACHE_FORMAT,
            "tokenizer": tokenizer.fingerprint,
            "bos": tokenizer.bos_id,
            "eos": tokenizer.eos_id,
            "files": file_hashes,
        }
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:24]


def _tokenize(tokenizer: Tokenizer, files: Sequence[str | os.PathLike]) -> TokenizedCorpus:
    encoded = tokenizer.encode_batch(list(read_documents(files)), add_bos=True, add_eos=True)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = np.fromiter(
        itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(offsets[-1])
    )
    return TokenizedCorpus(tokens, offsets)


def tokenize_files(
    tokenizer: Tokenizer,
    files: Sequence[str | os.PathLike],
    *,
    cache_dir: str | os.PathLike | None = None,
) -> TokenizedCorpus:
    """Tokenizes the documents of ``files`` (BOS and EOS added), reusing ``cache_dir`` if given."""
    files = list(files)
    if cache_dir is None:
        return _tokenize(tokenizer, files)
    cache_dir = pathlib.Path(cache_dir)
    path = cache_dir / f"tokens-{_cache_key(tokenizer, files)}.npz"
    if path.is_file():
        with np.load(path) as cached:
            return TokenizedCorpus(cached["tokens"], cached["offsets"])
    corpus = _tokenize(tokenizer, files)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with atomic_write(path, "wb") as f:  # a concurrent reader never sees a partial file
        np.savez(f, tokens=corpus.tokens, offsets=corpus.offsets)
    return corpus
