"""Text and ranking metrics against their outside references (sacrebleu, rouge-score, sklearn)
and slow hand-written versions."""

import collections
import math
import string

import numpy as np
import pytest
import sacrebleu
from hypothesis import given, settings
from hypothesis import strategies as st
from rouge_score import rouge_scorer
from sklearn.metrics import average_precision_score, ndcg_score

from agentic_jax.eval.ranking import (
    average_precision,
    mean_average_precision,
    mean_reciprocal_rank,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
    reciprocal_rank,
)
from agentic_jax.eval.text_metrics import (
    bleu,
    chrf,
    exact_match,
    normalize_answer,
    numeric_match,
    perplexity,
    rouge,
    token_f1,
)

WORDS = st.sampled_from(["the", "a", "cat", "sat", "on", "mat", "dog", "ran", "An", "Mat,", "42"])
SENTENCES = st.lists(WORDS, min_size=1, max_size=12).map(" ".join)


def test_squad_normalisation_and_exact_match():
    assert normalize_answer("The  Cat, sat!") == "cat sat"
    assert exact_match("the Eiffel tower.", ["Eiffel Tower", "Paris"]) == 1.0
    assert exact_match("Paris, France", "Paris") == 0.0
    with pytest.raises(ValueError, match="at least one reference"):
        exact_match("x", [])


@settings(max_examples=60, deadline=None)
@given(SENTENCES, st.lists(SENTENCES, min_size=1, max_size=3))
def test_token_f1_equals_a_slow_counter_reference(prediction, references):
    def slow(p, r):
        table = str.maketrans("", "", string.punctuation)
        tok = [w for w in p.lower().translate(table).split() if w not in ("a", "an", "the")]
        ref = [w for w in r.lower().translate(table).split() if w not in ("a", "an", "the")]
        if not tok or not ref:
            return float(tok == ref)
        same = sum((collections.Counter(tok) & collections.Counter(ref)).values())
        return 0.0 if same == 0 else 2 * same / (len(tok) + len(ref))

    assert token_f1(prediction, references) == pytest.approx(
        max(slow(prediction, r) for r in references)
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(SENTENCES, SENTENCES, SENTENCES), min_size=1, max_size=5))
def test_bleu_chrf_and_rouge_equal_the_reference_libraries(rows):
    hyps, first, second = map(list, zip(*rows))
    refs = [[a, b] for a, b in zip(first, second)]
    assert bleu(hyps, refs) == pytest.approx(sacrebleu.corpus_bleu(hyps, [first, second]).score)
    assert chrf(hyps, refs) == pytest.approx(sacrebleu.corpus_chrf(hyps, [first, second]).score)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=False)
    scores = [scorer.score(r, h) for h, r in zip(hyps, first)]
    got = rouge(hyps, first)
    for key in got:
        assert got[key] == pytest.approx(np.mean([s[key].fmeasure for s in scores]))


def test_corpus_scores_take_ragged_references_and_reject_bad_shapes():
    assert bleu(["a b c d e"], [["a b c d e"]]) == pytest.approx(100.0)
    assert bleu(["a b c d", "x y z w"], [["a b c d"], ["x y z w", "q"]]) == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 hypotheses but 1"):
        bleu(["a", "b"], [["a"]])
    with pytest.raises(ValueError, match="non-empty list"):
        chrf(["a"], ["a"])


def test_numeric_match_reads_the_last_number_within_tolerance():
    assert numeric_match("so the answer is 1,234.", 1234)
    assert numeric_match("about 3/4", "0.75") and numeric_match("-2.5 then -7", -7)
    assert numeric_match("50%", 0.5) and not numeric_match("no number", 1)
    assert numeric_match("0.1000001", 0.1, rel_tol=1e-5) and not numeric_match("0.11", 0.1)


def test_perplexity_is_exp_of_the_mean_negative_logprob():
    logprobs = np.log([[0.5, 0.25], [0.125, 1.0]])
    assert perplexity(logprobs) == pytest.approx(math.exp(-np.log([0.5, 0.25, 0.125, 1]).mean()))
    assert perplexity(logprobs, [[1, 1], [0, 0]]) == pytest.approx(math.sqrt(8))
    with pytest.raises(ValueError, match="does not match"):
        perplexity(logprobs, [1, 1])
    with pytest.raises(ValueError, match="no tokens"):
        perplexity(logprobs, np.zeros((2, 2)))


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_ndcg_and_average_precision_equal_sklearn(data):
    n = data.draw(st.integers(2, 10))
    gains = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    ranking = data.draw(st.permutations(range(n)))
    k = data.draw(st.integers(1, n))
    scores = np.zeros(n)
    scores[list(ranking)] = np.arange(n, 0, -1)  # no ties: the ranking's order
    exponential = (2.0 ** np.array(gains) - 1)[None]
    expected = ndcg_score(exponential, scores[None], k=k) if any(gains) else 0.0
    assert ndcg_at_k(list(ranking), dict(enumerate(gains)), k) == pytest.approx(expected)
    relevant = {i for i, g in enumerate(gains) if g > 0}
    if relevant:
        binary = np.array([g > 0 for g in gains])
        assert average_precision(list(ranking), relevant) == pytest.approx(
            average_precision_score(binary, scores)
        )


def test_recall_precision_and_reciprocal_rank_by_hand():
    ranking, relevant = ["d", "a", "x", "b"], {"a", "b", "c"}
    assert recall_at_k(ranking, relevant, 2) == pytest.approx(1 / 3)
    assert precision_at_k(ranking, relevant, 4) == pytest.approx(0.5)
    assert reciprocal_rank(ranking, relevant) == 0.5 and reciprocal_rank(["x"], relevant) == 0.0
    assert mean_reciprocal_rank([ranking, ["a"]], [relevant, relevant]) == pytest.approx(0.75)
    # AP: hits at ranks 2 and 4 -> (1/2 + 2/4) / 3 relevant.
    assert average_precision(ranking, relevant) == pytest.approx(1 / 3)
    assert mean_average_precision([ranking], [relevant]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="k must be >= 1"):
        recall_at_k(ranking, relevant, 0)
