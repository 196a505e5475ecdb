"""The long-horizon generator: every has-answer label points at a turn that really holds the
answer, abstention questions have none (and nothing in the history answers them), and the
extractive reader answers every question right from the whole history."""

import re

import pytest

from agentic_jax.memory.longhorizon import (
    TYPES,
    UNKNOWN,
    date,
    extractive_answer,
    generate_history,
    user_attribute,
)


@pytest.mark.parametrize("seed", [0, 1])
def test_labels_point_at_the_answer_and_the_full_history_answers_everything(seed):
    history = generate_history("ann", sessions=100, per_type=3, seed=seed)
    assert history == generate_history("ann", sessions=100, per_type=3, seed=seed)
    assert len(history.sessions) == 100
    turns = {t.id: t for t in history.turns}
    assert [t.time for t in history.turns] == sorted(t.time for t in history.turns)
    assert {q.type for q in history.questions} == set(TYPES)
    for q in history.questions:
        evidence = [turns[e] for e in q.evidence]
        matched = [m.group("a") for t in evidence for m in re.finditer(q.pattern, t.text)]
        assert len(matched) == len(evidence), q  # each labelled turn holds a matching span
        if q.type == "abstention":
            assert q.answer == UNKNOWN and not q.evidence
            assert not any(re.search(q.pattern, t.text) for t in history.turns), q
        elif q.type == "multi-session":
            assert len({t.session for t in evidence}) == 2
            assert sum(map(int, matched)) == int(q.answer)
        elif q.combine == "earliest":
            assert len({t.session for t in evidence}) == 2
            assert q.answer == matched[0 if evidence[0].time < evidence[1].time else 1]
        elif q.combine == "date":
            assert date(evidence[0].time) == q.answer and q.answer in evidence[0].line()
        else:
            assert q.answer in evidence[0].text
        # No unlabelled turn matches (filler reuses the nouns, never the statement), except the
        # stale value of a knowledge update.
        unlabelled = [t for t in history.turns if t.id not in q.evidence]
        stale = [t for t in unlabelled if re.search(q.pattern, t.text)]
        assert len(stale) == (q.type == "knowledge-update"), q
        if stale:
            assert stale[0].time < evidence[0].time and q.answer not in stale[0].text
        assert extractive_answer(q, history.turns) == q.answer, q
        assert extractive_answer(q, []) == UNKNOWN


def test_the_reader_needs_every_part_and_the_extractor_reads_attributes():
    history = generate_history("bob", sessions=40, per_type=1)
    turns = {t.id: t for t in history.turns}
    for q in history.questions:
        if len(q.evidence) == 2:  # a total or an order needs both turns
            assert extractive_answer(q, [turns[q.evidence[0]]]) != q.answer, q
    assert user_attribute("I just moved to Porto.") == ("home", "Porto")
    assert user_attribute("My colleague's sister's name is Maya.") is None
    with pytest.raises(ValueError, match="sessions"):
        generate_history("x", sessions=5, per_type=1)
