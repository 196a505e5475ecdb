"""Text metrics: SQuAD exact match and F1, BLEU, chrF, ROUGE, numeric answers and perplexity.

Scores of generated text are only comparable across papers when they are computed the way the
papers compute them, so the corpus metrics delegate to the reference implementations
(``sacrebleu`` for BLEU and chrF, ``rouge_score`` for ROUGE) with their default settings, and
the SQuAD metrics follow the official evaluation script line by line.  What this module adds
is one calling convention (``references[i]`` belongs to ``hypotheses[i]``, any number of them)
and input checks that say what is wrong instead of failing deep inside a library.

``sacrebleu`` and ``rouge_score`` are imported when first used: ``rouge_score`` pulls in NLTK,
which takes seconds, and the other metrics need neither.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from functools import cache
from numbers import Real

import numpy as np

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)
# A number: an optional minus sign (not a hyphen inside a word), then a fraction of integers,
# or an integer (optionally with comma thousands separators) with optional decimals, or a bare
# decimal such as ".5"; an optional trailing percent sign.
_NUMBER = re.compile(
    r"(?P<sign>(?<![\w)])-)?"
    r"(?:(?P<num>\d+)\s*/\s*(?P<den>\d+)"
    r"|(?P<value>(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+))"
    r"(?P<percent>%)?"
)


def normalize_answer(text: str) -> str:
    """SQuAD answer normalisation (Rajpurkar et al. 2016, official ``evaluate-v1.1.py``).

    Lowercase, drop ASCII punctuation, drop the articles *a*, *an*, *the* as whole words, and
    collapse runs of whitespace to single spaces.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _reference_list(references: str | Sequence[str]) -> list[str]:
    """``references`` as a non-empty list of strings (a single string is one reference)."""
    if isinstance(references, str):
        return [references]
    references = list(references)
    if not references:
        raise ValueError("references is empty: need at least one reference answer")
    for reference in references:
        if not isinstance(reference, str):
            raise TypeError(f"every reference must be a str, got {type(reference).__name__}")
    return references


def exact_match(prediction: str, references: str | Sequence[str]) -> float:
    """1.0 when ``prediction`` equals some reference after :func:`normalize_answer`, else 0.0
    (SQuAD EM, Rajpurkar et al. 2016)."""
    prediction = normalize_answer(prediction)
    return float(any(prediction == normalize_answer(r) for r in _reference_list(references)))


def _f1(prediction_tokens: list[str], reference_tokens: list[str]) -> float:
    if not prediction_tokens or not reference_tokens:
        return float(prediction_tokens == reference_tokens)
    overlap = sum((Counter(prediction_tokens) & Counter(reference_tokens)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(prediction_tokens), overlap / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references: str | Sequence[str]) -> float:
    """SQuAD token F1 (Rajpurkar et al. 2016), the maximum over ``references``.

    With ``c`` the size of the multiset intersection of the normalised tokens,
    ``P = c / |prediction|``, ``R = c / |reference|`` and ``F1 = 2PR / (P + R)``.  Two empty
    answers score 1.0; one empty answer scores 0.0.
    """
    prediction_tokens = normalize_answer(prediction).split()
    return max(
        _f1(prediction_tokens, normalize_answer(r).split()) for r in _reference_list(references)
    )


def _reference_streams(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]]
) -> list[list[str | None]]:
    """Checks a corpus and transposes ``references[i]`` (those of hypothesis ``i``) into
    sacrebleu's reference streams, padding with ``None`` where a hypothesis has fewer."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be lists, not a single str")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses and references have different lengths: {len(hypotheses)} hypotheses "
            f"but {len(references)} reference lists"
        )
    if not hypotheses:
        raise ValueError("hypotheses is empty: need at least one hypothesis")
    for i, hypothesis in enumerate(hypotheses):
        if not isinstance(hypothesis, str):
            raise TypeError(f"hypothesis {i} must be a str, got {type(hypothesis).__name__}")
    for i, refs in enumerate(references):
        if isinstance(refs, str) or not isinstance(refs, Sequence) or not refs:
            raise ValueError(
                f"references[{i}] must be a non-empty list of str (the references of "
                f"hypothesis {i}), got {refs!r}"
            )
        for reference in refs:
            if not isinstance(reference, str):
                raise TypeError(f"references[{i}] holds a {type(reference).__name__}, not a str")
    width = max(len(refs) for refs in references)
    return [[refs[j] if j < len(refs) else None for refs in references] for j in range(width)]


def bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus BLEU in [0, 100] (Papineni et al. 2002), sacrebleu's default settings.

    ``BP · exp(Σ_n ¼ log p_n)`` over n-grams n = 1..4 with the ``13a`` tokeniser, ``exp``
    smoothing and brevity penalty ``BP = min(1, exp(1 - r / c))``; ``references[i]`` are the
    references of ``hypotheses[i]``, any number per hypothesis.
    """
    from sacrebleu.metrics import BLEU

    streams = _reference_streams(hypotheses, references)
    return float(BLEU().corpus_score(list(hypotheses), streams).score)


def chrf(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """Corpus chrF in [0, 100] (Popović 2015), sacrebleu's defaults: character n-grams up to 6,
    ``β = 2``, whitespace ignored; ``references[i]`` are the references of ``hypotheses[i]``."""
    from sacrebleu.metrics import CHRF

    streams = _reference_streams(hypotheses, references)
    return float(CHRF().corpus_score(list(hypotheses), streams).score)


_ROUGE_KEYS = ("rouge1", "rouge2", "rougeL")


@cache
def _rouge_scorer():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(_ROUGE_KEYS), use_stemmer=False)


def rouge(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F-measures (Lin 2004) in [0, 1], one reference per
    hypothesis, computed by ``rouge_score`` without stemming.

    ROUGE-N is the F-measure of n-gram overlap; ROUGE-L that of the longest common subsequence.
    """
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be lists, not a single str")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses and references have different lengths: {len(hypotheses)} and "
            f"{len(references)}"
        )
    if not hypotheses:
        raise ValueError("hypotheses is empty: need at least one hypothesis")
    for name, texts in (("hypothesis", hypotheses), ("reference", references)):
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"{name} {i} must be a str, got {type(text).__name__}")
    scorer = _rouge_scorer()
    scores = [scorer.score(r, h) for h, r in zip(hypotheses, references)]
    return {key: float(np.mean([s[key].fmeasure for s in scores])) for key in _ROUGE_KEYS}


def _last_number(text: str) -> tuple[Fraction, bool] | None:
    """The last number written in ``text`` and whether a percent sign followed it."""
    for match in reversed(list(_NUMBER.finditer(text))):
        if match["value"] is not None:
            value = Fraction(match["value"].replace(",", ""))
        elif int(match["den"]) == 0:
            continue
        else:
            value = Fraction(int(match["num"]), int(match["den"]))
        return (-value if match["sign"] else value), match["percent"] is not None
    return None


def numeric_match(
    prediction: str, reference: str | Real, *, rel_tol: float = 1e-6, abs_tol: float = 1e-9
) -> bool:
    """Whether the last number in ``prediction`` equals ``reference`` (``math.isclose``).

    Numbers may be negative, have decimals, comma thousands separators (``1,234.5``) or be a
    fraction of integers (``3/4``).  A percentage matches both ways it is read: ``50%`` matches
    50 and 0.5.  A string ``reference`` is read the same way (its last number).  No number in
    ``prediction`` is no match.
    """
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a str, got {type(prediction).__name__}")
    if isinstance(reference, str):
        parsed = _last_number(reference)
        if parsed is None:
            raise ValueError(f"reference {reference!r} contains no number")
        target = float(parsed[0] / 100 if parsed[1] else parsed[0])
    elif isinstance(reference, Real) and not isinstance(reference, bool):
        target = float(reference)
    else:
        raise TypeError(f"reference must be a number or a str, got {type(reference).__name__}")
    found = _last_number(prediction)
    if found is None:
        return False
    value, percent = found
    candidates = (value, value / 100) if percent else (value,)
    return any(math.isclose(float(c), target, rel_tol=rel_tol, abs_tol=abs_tol) for c in candidates)


def perplexity(token_logprobs, mask=None) -> float:
    """``exp(-Σ m_t log p_t / Σ m_t)``: the exponentiated mean negative log-likelihood of the
    tokens that ``mask`` selects (all when ``None``).

    ``token_logprobs`` are natural-log probabilities of the observed tokens, shape ``[time]`` or
    ``[batch, time]``; ``mask`` has the same shape, non-zero where a token counts.
    """
    logprobs = np.asarray(token_logprobs, np.float64)
    if logprobs.ndim not in (1, 2):
        raise ValueError(f"token_logprobs must be 1-D or 2-D [batch, time], got {logprobs.shape}")
    if mask is None:
        keep = np.ones(logprobs.shape, bool)
    else:
        keep = np.asarray(mask) != 0
        if keep.shape != logprobs.shape:
            raise ValueError(
                f"mask shape {keep.shape} does not match token_logprobs shape {logprobs.shape}"
            )
    if not keep.any():
        raise ValueError("no tokens to score: token_logprobs is empty or mask selects none")
    selected = logprobs[keep]
    if np.isnan(selected).any():
        raise ValueError("token_logprobs has NaN at masked-in positions")
    if (selected > 0).any():
        raise ValueError("token_logprobs must be log-probabilities (<= 0); got a positive value")
    return float(np.exp(-selected.mean()))
