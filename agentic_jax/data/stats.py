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
    return entropy_of_counts(np.bincount(ids))


def entropy_of_counts(counts) -> float:
    """Shannon entropy ``H = -sum_i p_i log p_i`` in nats of the distribution proportional to
    ``counts`` (token frequencies).  Counts that are negative or all zero define no distribution
    (the formula would silently give -0.0 or a meaningless value), so they fail instead."""
    counts = np.asarray(counts)
    if counts.size == 0 or counts.min() < 0 or counts.sum() == 0:
        raise ValueError("entropy_of_counts needs non-negative counts with a positive total")
    p = counts[counts > 0] / counts.sum()
    return float((p * -np.log(p)).sum())  # not -(...), which makes one token's 0.0 into -0.0
