"""Reciprocal rank fusion by its formula, generated queries (RAG-Fusion, rewriting), HyDE, hybrid
and parent-child retrieval, each with scripted generators and encoders."""

from fractions import Fraction

import numpy as np
import pytest

from agentic_jax.agents import ScriptedPolicy
from agentic_jax.retrieval import (
    BM25,
    DenseIndex,
    DenseRetriever,
    Document,
    FusionRetriever,
    Hit,
    HyDE,
    MultiQueryRetriever,
    ParentChildChunker,
    ParentRetriever,
    RecursiveChunker,
    Retriever,
    as_generator,
    parse_queries,
    reciprocal_rank_fusion,
)
from agentic_jax.retrieval.fusion import REWRITE_PROMPT


def rrf(rankings, k=60):
    """The formula, in exact arithmetic: sum over rankings of 1 / (k + rank)."""
    scores = {}
    for ranking in rankings:
        for rank, chunk in enumerate(ranking, 1):
            scores[chunk] = scores.get(chunk, 0) + Fraction(1, k + rank)
    return scores


def test_rrf_is_its_formula_with_ties_by_first_reading():
    rankings = [["a", "b", "c", "d"], ["c", "a", "e"], ["e", "f"], []]
    fused = reciprocal_rank_fusion(rankings)
    expected = rrf(rankings)
    assert {h.id for h in fused} == set(expected)
    for hit in fused:
        assert hit.score == pytest.approx(float(expected[hit.id]), rel=1e-15)
    # a: 1/61 + 1/62 = c: 1/63 + 1/61 < ... ; ties read rank by rank: a (first of list 1), c, e.
    assert [h.id for h in fused] == ["a", "c", "e", "b", "f", "d"]
    assert [h.rank for h in fused] == [1, 2, 3, 4, 5, 6]
    hits = [Hit("x", 9.0, 1), Hit("y", 3.0, 2)]
    assert [h.id for h in reciprocal_rank_fusion([hits, ["y"]], k=1)] == ["y", "x"]
    assert reciprocal_rank_fusion([]) == []


class Scripted:
    """A retriever with a fixed ranking per query; it records what it was asked."""

    def __init__(self, rankings):
        self.rankings, self.asked = rankings, []

    def search(self, query, k):
        self.asked.append((query, k))
        return [Hit(c, 1.0, r) for r, c in enumerate(self.rankings.get(query, [])[:k], 1)]


def test_rag_fusion_retrieves_the_fused_union_of_its_queries():
    base = Scripted(
        {"why jit": ["j1", "j2", "x"], "jit tracing": ["t1", "j1"], "xla compile": ["x", "t1"]}
    )
    generated = "1. jit tracing\n2) xla compile\n- jit tracing\n\n3. extra query"
    policy = ScriptedPolicy([generated])
    fusion = MultiQueryRetriever(base, policy, n=2, depth=3)
    hits = fusion.search("why jit", 10)
    assert "why jit" in policy.calls[0][0][0].content  # the prompt names the question
    assert base.asked == [("why jit", 3), ("jit tracing", 3), ("xla compile", 3)]
    expected = rrf([["j1", "j2", "x"], ["t1", "j1"], ["x", "t1"]])
    # The union of the three rankings, by the formula; j1 and t1 tie, j1 read first.
    assert [h.id for h in hits] == ["j1", "t1", "x", "j2"]
    assert [h.score for h in hits] == pytest.approx([float(expected[h.id]) for h in hits])


def test_query_rewriting_searches_the_rewritten_query_alone():
    base = Scripted({"jax jit compilation": ["a", "b"]})
    rewrite = MultiQueryRetriever(
        base,
        lambda prompt: "jax jit compilation\n",
        n=1,
        include_original=False,
        prompt=REWRITE_PROMPT,
    )
    assert rewrite.queries("how does jit work?") == ["jax jit compilation"]
    assert [h.id for h in rewrite.search("how does jit work?", 5)] == ["a", "b"]
    assert base.asked == [("jax jit compilation", 5)]


def test_generators_and_query_parsing():
    assert parse_queries(" 1. alpha\n* beta\n\n2) alpha\n• gamma ") == ["alpha", "beta", "gamma"]
    policy = ScriptedPolicy(["text"])
    assert as_generator(policy, temperature=0.5)("prompt") == "text"
    assert policy.calls[0][2] == {"temperature": 0.5}
    with pytest.raises(TypeError, match="callable or has respond"):
        as_generator("not a generator")


def test_hyde_searches_with_the_embedded_hypothetical_passage():
    index = DenseIndex(metric="dot")
    index.add(["doc_a", "doc_b", "doc_c"], [[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    encoded = []

    def encode(texts):
        encoded.append(list(texts))
        return np.array([[1.0, 0.0] if "passage" in t else [0.0, 1.0] for t in texts])

    prompts = []

    def generate(prompt):
        prompts.append(prompt)
        return "a hypothetical passage"

    dense = DenseRetriever(index, encode)
    hyde = HyDE(dense, generate, include_query=False)
    assert [h.id for h in hyde.search("question?", 1)] == ["doc_a"]  # the passage's neighbour
    assert [h.id for h in dense.search("question?", 1)] == ["doc_b"]  # the query's own
    assert encoded[0] == ["a hypothetical passage"] and "question?" in prompts[0]
    # With the query (the paper's average): (f(d_1) + f(d_2) + f(q)) / 3 = (2/3, 1/3).
    encoded.clear()
    hits = HyDE(dense, generate, n=2).search("question?", 3)
    assert encoded == [["a hypothetical passage", "a hypothetical passage", "question?"]]
    assert hits == index.search_embeddings([[2 / 3, 1 / 3]], 3)[0]


def test_hybrid_bm25_and_dense_fuse_by_rrf():
    texts = {"a": "jax compiles with xla", "b": "grain loads data", "c": "xla fuses"}
    bm25 = BM25(list(texts.values()), list(texts))
    index = DenseIndex(metric="cosine")
    index.add(["a", "b", "c"], [[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    dense = DenseRetriever(index, lambda texts: np.array([[0.0, 1.0]] * len(texts)))
    assert all(isinstance(r, Retriever) for r in (bm25, dense))
    hybrid = FusionRetriever([bm25, dense], depth=3)
    sparse_ids = [h.id for h in bm25.search("xla", 3)]
    dense_ids = [h.id for h in dense.search("xla", 3)]
    assert sparse_ids == ["c", "a"] and dense_ids == ["b", "c", "a"]
    assert hybrid.search("xla", 2) == reciprocal_rank_fusion([sparse_ids, dense_ids])[:2]
    assert [h.id for h in hybrid.search("xla", 2)] == ["c", "a"]


def test_parent_retriever_returns_the_parents_of_the_best_children():
    text = "Alpha beta. Gamma delta. Alpha again.\n\nZeta eta. Theta iota. Kappa alpha."
    parents, children = ParentChildChunker(RecursiveChunker(40), RecursiveChunker(12)).chunk(
        Document("d", text)
    )
    assert len(parents) == 2 and len(children) > 4
    child_index = BM25([c.text for c in children], [c.id for c in children])
    retriever = ParentRetriever(child_index, {c.id: c.parent_id for c in children})
    hits = retriever.search("alpha", 2)
    # Three children match "alpha": two in the first parent, one in the second.
    assert [h.id for h in hits] == ["d#0", "d#1"]
    best_child = child_index.search("alpha", 1)[0]
    assert hits[0].score == best_child.score and [h.rank for h in hits] == [1, 2]
    assert [h.id for h in retriever.search("theta", 5)] == ["d#1"]
