"""Choosing one answer from many samples: votes and best-of-N.

The sampling-and-selection half of test-time compute (Wang et al. 2022, arXiv:2203.11171;
Lightman et al. 2023, arXiv:2305.20050; Snell et al. 2024, arXiv:2408.03314).  Everything here
is a pure function of answers and scores, so the same code selects among samples from the
batched decoder, the serving engine or a recorded run (a process reward model's step scores
become one score by ``rl.aggregate_steps``).  ``None`` stands for a sample whose answer could
not be extracted: it never wins a vote.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np


def _weights(answers: Sequence, weights) -> np.ndarray:
    if weights is None:
        return np.ones(len(answers))
    weights = np.asarray(weights, np.float64)
    if weights.shape != (len(answers),):
        raise ValueError(f"need one weight per answer ({len(answers)}), got shape {weights.shape}")
    if not np.all(np.isfinite(weights)):
        raise ValueError("weights must be finite")
    return weights


def majority_vote(answers: Sequence[Hashable | None], weights=None) -> Hashable | None:
    """The answer with the largest total weight (a count when ``weights`` is None).

    Self-consistency (Wang et al. 2022).  Ties go to the tied answer that appears first in
    ``answers``, so the rule is deterministic and, for samples in generation order, favours
    the earliest sample.  ``None`` answers are skipped; with no extracted answer it returns None.
    Weighting by a reward model's scores is *weighted best-of-N* (Li et al. 2023,
    arXiv:2206.02336); by exp(log-probability) it is probability-weighted voting.
    """
    weights = _weights(answers, weights)
    totals: dict = {}
    for answer, weight in zip(answers, weights):
        if answer is not None:
            totals[answer] = totals.get(answer, 0.0) + weight
    if not totals:
        return None
    best = max(totals.values())
    return next(a for a in totals if totals[a] == best)


def maj_at_k(answers: Sequence[Sequence[Hashable | None]], targets: Sequence, k: int) -> np.ndarray:
    """Per problem, 1.0 when the majority vote over its first ``k`` samples equals its target."""
    if len(answers) != len(targets):
        raise ValueError(f"{len(answers)} answer lists for {len(targets)} targets")
    if k < 1 or any(len(a) < k for a in answers):
        raise ValueError(f"maj@{k} needs k >= 1 and at least k samples per problem")
    return np.array([float(majority_vote(a[:k]) == t) for a, t in zip(answers, targets)])


def best_of_n(scores) -> np.ndarray:
    """Index of the best-scoring sample along the last axis (first on ties): best-of-N by an
    outcome or process reward model's scores.  With the verifier's 0/1 rewards as scores the
    chosen sample is correct exactly when any sample is: oracle best-of-N, i.e. pass@N."""
    scores = np.asarray(scores, np.float64)
    if scores.ndim < 1 or scores.shape[-1] == 0:
        raise ValueError(f"need scores of shape [..., N] with N >= 1, got {scores.shape}")
    return np.argmax(scores, axis=-1)
