"""Token statistics used as baselines for language-model losses."""
from __future__ import annotations

import numpy as np


def unigram_entropy(token_ids) -> float:
    """Entropy in nats/token of the empirical unigram distribution of ``token_ids``.

    It is the cross-entropy of the best context-free model of this stream, so a language model
    whose held-out loss (in nats) is below it has learnt to use context.
    """
    ids = np.asarray(token_ids).ravel()
    if ids.size == 0:
        raise ValueError("unigram_entropy of an empty token stream")
    counts = np.bincount(ids)
    p = counts[counts > 0] / ids.size
    return float(-(p * np.log(p)).sum())
