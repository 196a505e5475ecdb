"""A model-free embedding: words hashed into a fixed number of signed buckets.

Memory needs an ``embed`` function (texts to ``[n, dim]`` vectors) before any encoder is
trained or loaded: for demos, tests and configs that must run anywhere.  Feature hashing
(Weinberger, Dasgupta, Langford, Smola & Attenberg 2009, *Feature Hashing for Large Scale
Multitask Learning*) maps each word to one of ``dim`` buckets and a sign by a hash, so the
inner product of two texts' vectors is, in expectation, the number of words they share: cosine
similarity becomes word overlap, with no vocabulary and no training.  It sees no synonyms and no
word order; a trained encoder (``retrieval.encoders``) does, and takes its place by binding
``embed`` to it.
"""

from __future__ import annotations

import hashlib
import re

import gin
import numpy as np

_TOKEN = re.compile(r"\w+|[^\w\s]")  # words, and every other visible character on its own


@gin.configurable(module="memory")
class HashingEmbedder:
    """Texts to ``[n, dim]`` float32 vectors by signed feature hashing of their lower-cased
    words (module docstring); equal texts give equal vectors in every process (the hash is
    BLAKE2b, not Python's salted ``hash``)."""

    def __init__(self, dim: int = 256):
        if dim < 1:
            raise ValueError(f"dim must be positive, got {dim}")
        self.dim = dim

    def __call__(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), np.float32)
        for row, text in enumerate(texts):
            for token in _TOKEN.findall(text.lower()):
                digest = int.from_bytes(hashlib.blake2b(token.encode(), digest_size=8).digest())
                out[row, (digest >> 1) % self.dim] += 1.0 if digest & 1 else -1.0
        return out
