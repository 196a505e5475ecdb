"""The memory policies: read scores against a numpy reference of the Generative Agents formula,
decay, the token budget and MMR against a slow reference; the write policy's duplicates, PII
redaction and importance; working memory as a view of the context manager."""

import itertools
import tempfile
import zlib

import gin
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.agents.context.manager import ContextManager
from agentic_jax.memory import (
    ImportanceScorer,
    MemoryReader,
    MemoryRecord,
    MemoryStore,
    MemoryWriter,
    WorkingMemory,
    mmr_order,
    parse_importance,
    redact_pii,
)

HOUR = 3600.0
NOW = 1000 * HOUR


def _store(root, records):
    store = MemoryStore(root, clock=lambda: NOW)
    store.add(records)
    return store


def _random_records(rng, n, dim=8):
    return [
        MemoryRecord(
            id=f"m{i}",
            text=" ".join(["word"] * int(rng.integers(1, 30))),
            user="u",
            embedding=rng.normal(size=dim),
            importance=float(rng.integers(1, 11)),
            created_at=0.0,
            accessed_at=NOW - float(rng.uniform(0, 300)) * HOUR,
        )
        for i in range(n)
    ]


def _reference_scores(records, query, weights, decay):
    """Park et al.'s score, written out in float64."""
    vectors = np.array([r.embedding for r in records], np.float64)
    relevance = vectors @ query / np.linalg.norm(vectors, axis=1) / np.linalg.norm(query)
    recency = decay ** ((NOW - np.array([r.accessed_at for r in records])) / HOUR)
    importance = np.array([r.importance for r in records], np.float64)

    def norm(x):
        return (x - x.min()) / (x.max() - x.min()) if x.max() > x.min() else 0 * x

    return weights[0] * norm(relevance) + weights[1] * norm(recency) + weights[2] * norm(importance)


@given(
    seed=st.integers(0, 2**31),
    n=st.integers(1, 12),
    weights=st.tuples(*[st.floats(0, 2)] * 3),
    decay=st.floats(0.9, 1.0),
)
def test_read_scores_match_a_numpy_reference_of_the_formula(seed, n, weights, decay):
    rng = np.random.default_rng(seed)
    records = _random_records(rng, n)
    query = rng.normal(size=8)
    with tempfile.TemporaryDirectory() as root:
        store = _store(root, records)
        reader = MemoryReader(
            store,
            relevance_weight=weights[0],
            recency_weight=weights[1],
            importance_weight=weights[2],
            decay=decay,
            budget=None,
            candidates=None,
        )
        recalled = reader.read(query, user="u", now=NOW)
        assert all(r.accessed_at == NOW for r in store.records())  # reading is an access
    want = dict(zip([r.id for r in records], _reference_scores(records, query, weights, decay)))
    assert sorted(r.record.id for r in recalled) == sorted(want)
    np.testing.assert_allclose(
        [r.score for r in recalled], [want[r.record.id] for r in recalled], atol=1e-4
    )
    assert all(a.score >= b.score - 1e-4 for a, b in itertools.pairwise(recalled))
    for r in recalled:
        assert r.recency == pytest.approx(
            decay ** ((NOW - records[int(r.record.id[1:])].accessed_at) / HOUR)
        )


def test_recency_decays_by_the_hours_since_the_last_access(tmp_path):
    same = np.ones(4)
    records = [
        MemoryRecord(
            id=name, text=name, user="u", embedding=same, importance=5.0, accessed_at=NOW - h * HOUR
        )
        for name, h in (("week", 168), ("hour", 1), ("day", 24))
    ]
    reader = MemoryReader(
        _store(tmp_path, records), relevance_weight=0, importance_weight=0, decay=0.99
    )
    recalled = reader.read(same, now=NOW)
    assert [r.record.id for r in recalled] == ["hour", "day", "week"]
    assert [r.recency for r in recalled] == pytest.approx([0.99, 0.99**24, 0.99**168])
    assert [r.score for r in recalled] == pytest.approx(
        [1.0, (0.99**24 - 0.99**168) / (0.99 - 0.99**168), 0.0]
    )


@given(seed=st.integers(0, 2**31), budget=st.integers(0, 60), k=st.none() | st.integers(1, 5))
def test_the_token_budget_is_never_exceeded_and_only_what_cannot_fit_is_left(seed, budget, k):
    rng = np.random.default_rng(seed)
    records = _random_records(rng, 10)

    def words(text):
        return len(text.split())

    with tempfile.TemporaryDirectory() as root:
        reader = MemoryReader(_store(root, records), budget=budget, count=words, k=k)
        recalled = reader.read(rng.normal(size=8), now=NOW)
    used = sum(words(r.record.text) for r in recalled)
    assert used <= budget and (k is None or len(recalled) <= k)
    if k is None or len(recalled) < k:
        left = {r.id for r in records} - {r.record.id for r in recalled}
        assert all(words(r.text) > budget - used for r in records if r.id in left)


def test_a_tokenizer_counts_the_budget(tmp_path):
    class Chars:
        def encode(self, text):
            return list(text)

    records = [
        MemoryRecord(
            id=str(i), text="abcd" * (i + 1), user="u", embedding=np.ones(2), importance=1.0
        )
        for i in range(4)
    ]
    recalled = MemoryReader(_store(tmp_path, records), budget=13, count=Chars()).read(
        np.ones(2), now=NOW
    )
    assert sum(len(r.record.text) for r in recalled) <= 13


def _slow_mmr(scores, vectors, lam):
    def cos(a, b):
        return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))

    picked, left = [], list(range(len(scores)))
    while left:

        def value(i):
            penalty = max((cos(vectors[i], vectors[j]) for j in picked), default=0.0)
            return lam * scores[i] - (1 - lam) * penalty

        best = max(left, key=lambda i: (value(i), -i))
        picked.append(best)
        left.remove(best)
    return picked


@given(seed=st.integers(0, 2**31), n=st.integers(1, 15), lam=st.floats(0, 1))
def test_mmr_picks_match_a_slow_reference(seed, n, lam):
    rng = np.random.default_rng(seed)
    scores, vectors = rng.uniform(size=n), rng.normal(size=(n, 6))
    assert list(mmr_order(scores, vectors, lam, lambda i: True)) == _slow_mmr(scores, vectors, lam)


def test_mmr_prefers_a_new_fact_to_a_paraphrase(tmp_path):
    facts = {
        "tea": [1, 0, 0],
        "tea again": [0.99, 0.1, 0],  # a paraphrase: cosine 0.995 to the first
        "tea in Oslo": [0.7, 0, 0.7],
        "bike": [0, 1, 0],
    }
    records = [
        MemoryRecord(id=t, text=t, user="u", embedding=v, importance=5.0) for t, v in facts.items()
    ]
    store = _store(tmp_path, records)
    query = [1, 0, 0.3]
    plain = MemoryReader(store, k=2).read(query, now=NOW)
    diverse = MemoryReader(store, k=2, mmr=0.5).read(query, now=NOW)
    assert [r.record.id for r in plain] == ["tea", "tea again"]
    assert [r.record.id for r in diverse] == ["tea", "tea in Oslo"]


def _embed(texts, dim=64):
    """Bag of words hashed into ``dim`` buckets: equal texts are equal vectors."""
    out = np.zeros((len(texts), dim), np.float32)
    for row, text in enumerate(texts):
        for word in text.lower().split():
            out[row, zlib.crc32(word.encode()) % dim] += 1
    return out


@pytest.mark.parametrize("on_duplicate", ["skip", "merge"])
def test_near_duplicates_are_skipped_or_merged(tmp_path, on_duplicate):
    store = MemoryStore(tmp_path, clock=lambda: NOW)
    writer = MemoryWriter(store, _embed, on_duplicate=on_duplicate, threshold=0.9)
    first = writer.write(
        MemoryRecord(text="Ann likes green tea", user="ann", links=["a"], metadata={"x": 1})
    )
    assert first.action == "added"
    again = writer.write(
        MemoryRecord(
            text="ann likes green tea", user="ann", importance=9.0, links=["b"], metadata={"y": 2}
        )
    )
    assert (again.action, again.id) == (
        {"skip": "skipped", "merge": "merged"}[on_duplicate],
        first.id,
    )
    assert again.similarity == pytest.approx(1.0)
    [stored] = store.records()
    if on_duplicate == "merge":
        assert (stored.importance, stored.links, stored.metadata) == (
            9.0,
            ("a", "b"),
            {"x": 1, "y": 2},
        )
    else:
        assert (stored.links, stored.metadata) == (("a",), {"x": 1})
    assert writer.write(MemoryRecord(text="Ann likes green tea", user="bob")).action == "added"
    assert writer.write(MemoryRecord(text="Ann visited Oslo in May", user="ann")).action == "added"
    assert len(store.records()) == 3


def test_pii_is_redacted_before_it_is_embedded_or_stored(tmp_path):
    text = (
        "Mail ann.lee+work@example.co.uk or call +44 20 7946 0958 / (555) 123-4567; "
        "card 4111 1111 1111 1111, order 12345, on 2024-05-01."
    )
    assert redact_pii(text) == (
        "Mail [EMAIL] or call [PHONE] / [PHONE]; card [CARD], order 12345, on 2024-05-01."
    )
    seen = []

    def embed(texts):
        seen.extend(texts)
        return _embed(texts)

    store = MemoryStore(tmp_path)
    writer = MemoryWriter(store, embed)
    writer.write(
        MemoryRecord(
            text="reach me at bob@mail.com",
            user="bob",
            type="episodic",
            outcome="sent to bob@mail.com",
        )
    )
    [stored] = store.records()
    assert seen == ["reach me at [EMAIL]"] and stored.text == "reach me at [EMAIL]"
    assert stored.outcome == "sent to [EMAIL]"
    MemoryWriter(store, _embed, redact=None).write(MemoryRecord(text="keep x@y.org", user="c"))
    assert store.records(user="c")[0].text == "keep x@y.org"


@pytest.mark.parametrize(
    ("reply", "rating"),
    [
        ("7", 7.0),
        ("Rating: 8", 8.0),
        ("  I'd rate it 6/10 because it matters.", 6.0),
        ("On a scale of 1 to 10, this is a 9.", 9.0),
        ("Score: 4.5 (moderately important)", 4.5),
        ("seven", 7.0),
        ("It is 3 out of 10.", 3.0),
        ("Rating: 12", None),
        ("no idea", None),
        ("", None),
    ],
)
def test_importance_replies_are_parsed_robustly(reply, rating):
    assert parse_importance(reply) == rating


def test_importance_by_rules_by_a_model_or_both():
    rules = ImportanceScorer()
    assert rules("brushed teeth") == 1.0
    assert rules("Remember: Ann is allergic to nuts, deadline 5 May") == 1 + 3 + 2 + 2 + 1
    prompts = []

    def model(prompt):
        prompts.append(prompt)
        return "Rating: 9"

    assert ImportanceScorer(rules=None, generate=model)("x") == 9.0
    assert "Memory: x\n" in prompts[0]
    assert (
        ImportanceScorer(generate=model, model_weight=0.25)("brushed teeth") == 0.25 * 9 + 0.75 * 1
    )
    assert ImportanceScorer(generate=lambda p: "hmm")("brushed teeth") == 1.0  # falls back to rules
    assert ImportanceScorer(rules=None, generate=lambda p: "hmm", fallback=4.0)("x") == 4.0
    with pytest.raises(ValueError):
        ImportanceScorer(rules=None)


def test_working_memory_is_a_view_of_the_context_manager():
    context = ContextManager()
    working = WorkingMemory(context, user="ann")
    assert working.records() == []
    working.hold([MemoryRecord(text="Ann is allergic to nuts", user="ann", importance=9.0)])
    context.summary = "asked about dinner"
    held = working.records()
    assert [(r.type, r.text, r.source) for r in held] == [
        ("working", "Ann is allergic to nuts", "pinned"),
        ("working", "asked about dinner", "summary"),
    ]
    assert "Ann is allergic to nuts" in context.build("system", [])[0].content


def test_the_policies_are_configured_from_gin(tmp_path):
    with gin.unlock_config():
        gin.parse_config(
            [
                "memory.MemoryStore.space = 'agent7'",
                "memory.MemoryReader.decay = 0.9",
                "memory.MemoryReader.mmr = 0.7",
                "memory.MemoryWriter.on_duplicate = 'merge'",
                "memory.ImportanceScorer.model_weight = 0.2",
            ]
        )
    try:
        store = MemoryStore(tmp_path)
        reader, writer = MemoryReader(store), MemoryWriter(store, _embed)
        assert (store.path.name, reader.decay, reader.mmr) == ("agent7.db", 0.9, 0.7)
        assert (writer.on_duplicate, writer.importance.model_weight) == ("merge", 0.2)
    finally:
        gin.clear_config()
