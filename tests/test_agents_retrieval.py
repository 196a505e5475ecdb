"""Local BM25 retrieval: scores against a brute-force numpy BM25, file loading, the search tool."""

import math
import unicodedata

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.agents import ToolExecutor
from agentic_jax.agents.tools.retrieval import Hit, Retriever, retrieval_tool
from agentic_jax.data.chat import ToolCall

# Words of two or more letters that are not English stop words, so the reference tokeniser is a
# plain lower-case split.
WORDS = ["jax", "grad", "Vmap", "scan", "mesh", "shard", "kernel", "TOKEN"]


def reference_bm25(docs: list[list[str]], query: list[str], k1: float, b: float) -> np.ndarray:
    """Okapi BM25, Lucene variant, by its formula over every document and query token."""
    n = len(docs)
    lengths = np.array([len(d) for d in docs], float)
    avgdl = lengths.mean()
    scores = np.zeros(n)
    for term in query:
        df = sum(term in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(term)
            if tf:
                scores[i] += idf * tf / (tf + k1 * (1 - b + b * lengths[i] / avgdl))
    return scores


corpora = st.lists(st.lists(st.sampled_from(WORDS), max_size=10), min_size=1, max_size=8)
queries = st.lists(st.sampled_from(WORDS + ["absent"]), min_size=1, max_size=4)


@given(corpora, queries, st.sampled_from([(1.5, 0.75), (1.2, 0.3), (0.9, 1.0)]), st.integers(1, 9))
def test_search_matches_brute_force_bm25(docs, query, params, k):
    k1, b = params
    texts = [" ".join(d) for d in docs]
    lower = [[w.lower() for w in d] for d in docs]
    expected = reference_bm25(lower, [w.lower() for w in query], k1, b)
    retriever = Retriever.from_documents(texts, k1=k1, b=b)
    np.testing.assert_allclose(retriever.scores(" ".join(query)), expected, rtol=1e-5, atol=1e-6)
    hits = retriever.search(" ".join(query), k)
    # Best first, ties in document order, only documents sharing a query token.
    order = sorted(
        (i for i in range(len(docs)) if expected[i] > 1e-9),
        key=lambda i: (-round(expected[i], 5), i),
    )[:k]
    assert [h.id for h in hits] == [str(i) for i in order]
    for h in hits:
        assert h.text == texts[int(h.id)]
        assert h.score == pytest.approx(expected[int(h.id)], rel=1e-5)


def test_tokenisation_drops_stop_words_case_and_punctuation():
    retriever = Retriever.from_documents(
        ["The Mesh, sharded!", "a mesh of the devices"], ids=["x", "y"]
    )
    hits = retriever.search("MESH")
    assert [h.id for h in hits] == ["x", "y"]  # shorter document first
    assert retriever.search("the of a") == []  # stop words and one-letter words only
    assert Retriever.from_documents(["a b", "the"]).search("b") == []


@given(
    st.lists(
        st.sampled_from(["café", "naïve", "Ångström", "ﬁle", "ＪＡＸ", "jax"]),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["NFC", "NFD", "NFKD"]),
)
def test_unicode_forms_of_a_word_match_each_other(words, form):
    """Canonically (or compatibly) equivalent spellings are one word, whichever form the
    documents and the query come in."""
    text = " ".join(words)
    retriever = Retriever.from_documents([unicodedata.normalize(form, text), "unrelated words"])
    for query in (text, unicodedata.normalize("NFC", text), unicodedata.normalize("NFD", text)):
        assert [h.id for h in retriever.search(query)] == ["0"]


def test_from_path_directory_is_one_document_per_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.md").write_text("pallas kernels\n\nflash attention")
    (tmp_path / "sub" / "a.txt").write_text("ring attention")
    (tmp_path / "ignored.py").write_text("attention attention")
    retriever = Retriever.from_path(tmp_path)
    assert retriever.ids == ["b.md", "sub/a.txt"]
    assert [h.id for h in retriever.search("attention", k=5)] == ["sub/a.txt", "b.md"]


def test_from_path_file_is_one_document_per_paragraph(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("first paragraph about jax\ncontinued here\n\n\n  \nsecond about grain\n\n")
    retriever = Retriever.from_path(path)
    assert retriever.ids == ["notes.md#1", "notes.md#2"]
    assert retriever.texts[0] == "first paragraph about jax continued here"
    assert retriever.search("grain") == [
        Hit("notes.md#2", "second about grain", retriever.search("grain")[0].score)
    ]


def test_bad_input_is_named(tmp_path):
    with pytest.raises(ValueError, match="at least one document"):
        Retriever.from_documents([])
    with pytest.raises(ValueError, match="2 ids for 1 documents"):
        Retriever.from_documents(["x"], ids=["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        Retriever.from_documents(["x", "y"], ids=["a", "a"])
    with pytest.raises(FileNotFoundError, match="no file or directory"):
        Retriever.from_path(tmp_path / "missing")
    with pytest.raises(ValueError, match=r"no \.txt/\.md files"):
        Retriever.from_path(tmp_path)
    with pytest.raises(ValueError, match="k must be at least 1"):
        Retriever.from_documents(["x"]).search("x", k=0)


def test_retrieval_tool_schema_results_and_validation():
    retriever = Retriever.from_documents(["jax traces python", "grain loads data"], ids=["j", "g"])
    search = retrieval_tool(retriever, name="lookup", default_k=1)
    assert search.name == "lookup"
    assert search.parameters["properties"]["k"]["default"] == 1
    executor = ToolExecutor([search])
    result = executor.execute(ToolCall("lookup", {"query": "grain data"}))
    assert result.ok and result.content.startswith("[g] (score ")
    assert "jax" not in result.content  # default_k=1
    assert "no passage matches" in executor.execute(ToolCall("lookup", {"query": "zz"})).content
    bad = executor.execute(ToolCall("lookup", {"query": "jax", "k": 0}))
    assert bad.status == "invalid_arguments"
    with pytest.raises(ValueError, match="default_k"):
        retrieval_tool(retriever, default_k=0)
