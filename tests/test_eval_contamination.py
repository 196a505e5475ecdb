"""The n-gram contamination check against a brute-force search over token tuples."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.eval.contamination import (
    NgramIndex,
    clean_subset_score,
    contamination_report,
    ngrams,
    normalise,
)

ITEM = (
    "Which planet in the solar system has the largest number of confirmed moons, and how "
    "many had been confirmed by the end of 2023?"
)
CORPUS = [
    "Astronomy forum, page 3. Quiz night questions: which planet in the solar system has the "
    "LARGEST number of confirmed moons -- and how many had been confirmed by the end of 2023? "
    "Answers at the bottom of the page.",
    "Saturn's rings are made mostly of water ice, with a little rock and dust.",
]


def test_normalisation_lowercases_and_strips_punctuation():
    assert normalise("Don't  STOP, (me) now!\n3.5_x") == ["dont", "stop", "me", "now", "35x"]
    assert ngrams("a b c d", n=3) == [("a", "b", "c"), ("b", "c", "d")]
    assert ngrams("A, b!", n=3) == [("a", "b")]  # shorter than n: one gram of all its tokens
    assert ngrams("?!", n=3) == []


def test_finds_an_item_copied_into_a_longer_document():
    index = NgramIndex.build(CORPUS)
    report = contamination_report([ITEM], index)
    assert report.overlap[0] == 1.0 and report.flagged[0] and report.n_flagged == 1
    # Half of the item copied: the windows inside that half match, the rest do not.
    half = " ".join(ITEM.split()[:14]) + " whose orbit is the most eccentric of all known moons"
    overlap = index.overlap(half)
    assert 0 < overlap < 1
    assert overlap == pytest.approx(2 / len(ngrams(half)))


def test_does_not_flag_a_paraphrase_that_shares_no_13_gram():
    words = normalise(ITEM)
    # Replace every 12th word: no window of 13 consecutive words survives intact, though
    # almost every word is the same.
    paraphrase = " ".join("X" if i % 12 == 6 else w for i, w in enumerate(words))
    corpus_grams = {g for doc in CORPUS for g in ngrams(doc)}
    assert not set(ngrams(paraphrase)) & corpus_grams
    assert len(set(normalise(paraphrase)) & set(words)) >= len(set(words)) - 2
    report = contamination_report([paraphrase, ITEM], NgramIndex.build(CORPUS))
    assert report.overlap[0] == 0.0 and list(report.flagged) == [False, True]
    # A threshold keeps only items that matches mostly cover.
    assert not contamination_report([paraphrase], NgramIndex.build(CORPUS), 0.8).flagged[0]


def test_short_items_need_an_index_of_short_grams():
    item = "confirmed moons of saturn"  # 4 tokens < 13: one gram of all of them
    corpus = ["the count of confirmed moons of saturn rose to 146 in 2023"]
    default = contamination_report([item], NgramIndex.build(corpus))
    assert default.short[0] and not default.flagged[0]
    short = contamination_report([item], NgramIndex.build(corpus, min_n=4))
    assert not short.short[0] and short.flagged[0]
    # A corpus document shorter than min_n is indexed whole.
    assert NgramIndex.build(["Confirmed moons of Saturn!"]).overlap(item) == 1.0


def test_kept_symbols_tell_arithmetic_problems_apart():
    assert normalise("What is 3+4*-2?", "+-*/") == ["what", "is", "3", "+", "4", "*", "-", "2"]
    item, corpus = "What is 3 + 4?", ["Quiz: what is 3 * 4? Answers below."]
    # Deleted, the operators leave "what is 3 4" in both.
    assert NgramIndex.build(corpus, min_n=4).overlap(item) == 1.0
    assert NgramIndex.build(corpus, min_n=5, symbols="+-*/").overlap(item) == 0.0
    assert NgramIndex.build(["Quiz: what is 3+4?"], min_n=5, symbols="+-*/").overlap(item) == 1.0
    with pytest.raises(ValueError, match="symbols must be"):
        normalise("x", "a+")


words = st.lists(st.sampled_from(["a", "B", "c,", "d", "e.", "f+g"]), max_size=25)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(words, min_size=1, max_size=3),
    words,
    st.integers(1, 6),
    st.integers(0, 5),
    st.sampled_from(["", "+"]),
)
def test_overlap_equals_a_brute_force_search(corpus, item, n, drop, symbols):
    min_n = max(1, n - drop)
    texts = [" ".join(doc) for doc in corpus]
    index = NgramIndex.build(texts, n=n, min_n=min_n, symbols=symbols)
    stored = set()
    for doc in (normalise(text, symbols) for text in texts):
        if doc and len(doc) < min_n:
            stored.add(tuple(doc))
        for k in range(min_n, n + 1):
            stored |= {tuple(doc[i : i + k]) for i in range(len(doc) - k + 1)}
    grams = ngrams(" ".join(item), n, symbols)
    expected = np.mean([g in stored for g in grams]) if grams else 0.0
    assert index.overlap(" ".join(item)) == pytest.approx(expected)


def test_clean_subset_score():
    scores = [1.0, 0.0, 1.0, 1.0, 0.0]
    flags = np.array([True, False, False, True, False])
    assert clean_subset_score(scores, flags) == pytest.approx((0.6, 1 / 3, 1.0))
    everything, clean, dirty = clean_subset_score([0.5, 1.0], np.array([False, False]))
    assert (everything, clean) == (0.75, 0.75) and np.isnan(dirty)


def test_validation_errors_name_the_problem():
    with pytest.raises(ValueError, match="shape of scores"):
        clean_subset_score([1.0], np.array([True, False]))
    with pytest.raises(ValueError, match="booleans"):
        clean_subset_score([1.0, 0.0], [1, 0])
    with pytest.raises(ValueError, match="min_n"):
        NgramIndex.build(["a b"], n=3, min_n=5)
    with pytest.raises(ValueError, match="threshold"):
        contamination_report(["a"], NgramIndex.build(["a"]), threshold=1.0)
    with pytest.raises(ValueError, match="not one string"):
        contamination_report("a b c", NgramIndex.build(["a"]))
    with pytest.raises(ValueError, match="n must be"):
        ngrams("a", n=0)
