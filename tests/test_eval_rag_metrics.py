"""Citation precision and recall (faithfulness) of RAG answers: hand-made answers with known
values, the overlap and LLM support judges, and properties over random answers."""

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentic_jax.eval.rag_metrics import (
    SUPPORT_PROMPT,
    LLMSupportJudge,
    OverlapJudge,
    citation_scores,
    sentences_of,
)

TOWER = "The Eiffel Tower stands in Paris."
BUILT = "Construction finished in 1889."
BANANAS = "Bananas are yellow."
ANSWER = "The Eiffel Tower is in Paris [1]. It was built in 1889 [2].\nIt is made of cheese."


def test_sentences_drop_citation_markers_and_wordless_pieces():
    assert sentences_of(ANSWER) == [
        "The Eiffel Tower is in Paris .",
        "It was built in 1889 .",
        "It is made of cheese.",
    ]
    assert sentences_of(["One [1][2].", "[3]", " ... "]) == ["One ."]


def test_overlap_share_counts_the_sentences_content_words():
    judge = OverlapJudge()
    # Content words {eiffel, tower, paris}: all in the chunk; {tower} alone is a third.
    assert judge.share("The Eiffel Tower is in Paris.", TOWER) == 1.0
    assert judge.share("The Eiffel Tower is in Paris.", "The tower in Pisa leans.") == 1 / 3
    # {built, 1889}: half of them, exactly the threshold.
    assert judge.share("It was built in 1889.", BUILT) == 0.5
    assert judge("It was built in 1889.", BUILT)
    assert not OverlapJudge(threshold=0.6)("It was built in 1889.", BUILT)
    # Only stop words: all of them count.
    assert judge.share("It is.", "it was") == 0.5
    with pytest.raises(ValueError, match="threshold"):
        OverlapJudge(threshold=0)


def test_citation_scores_of_a_hand_made_answer():
    scores = citation_scores(ANSWER, [TOWER, BUILT, BANANAS])
    # Sentences 1 and 2 are supported (by the tower and the 1889 chunk), the cheese is not; the
    # bananas support nothing.
    np.testing.assert_array_equal(
        scores.support, [[True, False, False], [False, True, False], [False, False, False]]
    )
    assert scores.recall == pytest.approx(2 / 3) and scores.precision == pytest.approx(2 / 3)
    only_tower = citation_scores(ANSWER, [TOWER, TOWER])  # each citation counts
    assert only_tower.precision == 1.0 and only_tower.recall == pytest.approx(1 / 3)


def test_no_citations_score_zero_and_an_empty_answer_is_an_error():
    scores = citation_scores(ANSWER, [])
    assert scores.precision == scores.recall == 0.0 and scores.support.shape == (3, 0)
    with pytest.raises(ValueError, match="no sentence"):
        citation_scores(" [1]. ", [TOWER])
    with pytest.raises(TypeError, match="list of chunk texts"):
        citation_scores(ANSWER, TOWER)


class ScriptedJudge:
    """Replies "Score: 1" when the statement's words all occur in the passage, with a garbled
    reply for passages that mention bananas."""

    def __init__(self):
        self.seen = []

    def respond(self, messages, tools=(), **sampling):
        self.seen.append(sampling)
        prompt = messages[-1].content
        passage = prompt.split("[Passage]\n")[1].split("\n\n[Statement]")[0]
        statement = prompt.split("[Statement]\n")[1].split("\n\n")[0]
        if "Bananas" in passage:
            return types.SimpleNamespace(text="I cannot say.")
        words = set(statement.lower().strip(".").split())
        supported = words <= set(passage.lower().strip(".").split())
        return types.SimpleNamespace(text=f"Checked.\nScore: {int(supported)}")


def test_an_llm_judge_decides_support_and_keeps_every_grade():
    policy = ScriptedJudge()
    judge = LLMSupportJudge(policy, name="scripted")
    scores = citation_scores(["Tower stands in Paris.", "Bananas"], [TOWER, BANANAS], judge)
    np.testing.assert_array_equal(scores.support, [[True, False], [False, False]])
    assert scores.precision == 0.5 and scores.recall == 0.5
    assert len(judge.scores) == 4 and all(s.judge == "scripted" for s in judge.scores)
    assert all(s.prompt_sha256 == SUPPORT_PROMPT.sha256 for s in judge.scores)
    unparsed = [s for s in judge.scores if s.score is None]  # counted as no support
    assert len(unparsed) == 2 and all(s.error for s in unparsed)
    assert policy.seen[0] == {"temperature": 0.0}  # greedy, as judge.py's judges


WORDS = st.sampled_from(["paris", "tower", "iron", "river", "built", "it", "is", "1889"])
SENTENCES = st.lists(
    st.lists(WORDS, min_size=1, max_size=5).map(lambda w: " ".join(w) + "."),
    min_size=1,
    max_size=4,
)
CHUNKS = st.lists(st.lists(WORDS, max_size=6).map(" ".join), max_size=4)


@settings(max_examples=60, deadline=None)
@given(SENTENCES, CHUNKS, st.floats(0.05, 1.0))
def test_scores_are_shares_and_more_citations_never_lower_recall(sentences, chunks, threshold):
    judge = OverlapJudge(threshold)
    scores = citation_scores(sentences, chunks, judge)
    assert 0 <= scores.precision <= 1 and 0 <= scores.recall <= 1
    assert scores.support.shape == (len(sentences), len(chunks))
    more = citation_scores(sentences, [*chunks, "iron river"], judge)
    assert more.recall >= scores.recall
    if not chunks:
        assert scores.precision == 0.0  # the documented convention


@settings(max_examples=40, deadline=None)
@given(SENTENCES, CHUNKS)
def test_an_answer_its_citations_fully_support_scores_one(sentences, chunks):
    # Every cited chunk holds the whole answer: each supports every sentence.
    whole = " ".join(sentences)
    scores = citation_scores(sentences, [whole + " " + c for c in chunks] or [whole])
    assert scores.precision == 1.0 and scores.recall == 1.0
    always = citation_scores(sentences, chunks or ["anything"], lambda s, c: True)
    assert always.precision == 1.0 and always.recall == 1.0
