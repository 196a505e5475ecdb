"""The approximate (HNSW) index: its recall against exact search measured, its changes, saving and
loading checked against an exact index given the same calls, and bad input named."""

import itertools
import sys

import gin
import numpy as np
import pytest
from hypothesis import given

pytest.importorskip("usearch")

from test_retrieval_dense import operations  # the same random changes as the exact index's test

from agentic_jax.retrieval import DenseIndex, DenseRetriever, exact_top_k
from agentic_jax.retrieval.approximate import ApproximateIndex


def recall(index: ApproximateIndex, queries: np.ndarray, k: int) -> float:
    """The mean fraction of each query's exact top ``k`` that the graph finds."""
    _, rows = exact_top_k(queries, index.embeddings(index.ids), k, metric=index.metric)
    found = index.search_embeddings(queries, k)
    return np.mean(
        [
            len({index.ids[r] for r in exact} & {h.id for h in hits}) / k
            for exact, hits in zip(np.asarray(rows), found)
        ]
    )


@pytest.mark.parametrize("metric", ["cosine", "dot"])
def test_recall_is_measured_and_rises_with_expansion_search(metric):
    rng = np.random.default_rng(0)
    corpus = rng.normal(size=(3000, 16)).astype(np.float32)
    if metric == "cosine":
        corpus *= rng.uniform(0.5, 2, (len(corpus), 1))  # norms that cosine ignores
    queries = rng.normal(size=(64, 16)).astype(np.float32)
    index = ApproximateIndex(metric=metric, connectivity=8, expansion_add=64)
    index.add([f"c{i}" for i in range(len(corpus))], corpus)
    measured = []
    for expansion in (1, 8, 32, 128):
        index.expansion_search = expansion
        measured.append(recall(index, queries, 10))
    assert measured[-1] >= 0.95, measured
    assert measured[0] < measured[-1], measured  # a narrow beam misses neighbours
    assert all(b >= a - 0.02 for a, b in itertools.pairwise(measured)), measured


@given(operations)
def test_changed_saved_and_reloaded_index_agrees_with_exact_search(tmp_path_factory, ops):
    # Small integers make dot products exact in float32 in numpy and XLA alike.
    index = ApproximateIndex(3, metric="dot", expansion_search=64)  # a beam over every node
    exact, deleted = DenseIndex(3, metric="dot"), set()
    for op, keys, seed in ops:
        ids = [f"doc{key}" for key in keys]
        vectors = np.random.default_rng(seed).integers(-3, 4, (len(ids), 3)).astype(np.float32)
        args = [ids] if op == "delete" else [ids, vectors]
        try:
            getattr(exact, op)(*args)
        except KeyError:  # an add of a present id, an update or delete of a missing one
            with pytest.raises(KeyError):
                getattr(index, op)(*args)
            continue
        getattr(index, op)(*args)
        deleted = deleted | set(ids) if op == "delete" else deleted - set(ids)
    assert index.version == exact.version and index.ids == exact.ids

    queries = np.random.default_rng(len(ops)).integers(-3, 4, (4, 3)).astype(np.float32)
    everything = exact.search_embeddings(queries, max(len(exact), 1))
    top = index.search_embeddings(queries, 3)
    # A beam wider than the graph finds every node: the whole ranking is exact, ties included;
    # a short list has the exact scores (which of several tied ids ends it is the graph's).
    assert index.search_embeddings(queries, max(len(index), 1)) == everything
    assert [[h.score for h in row] for row in top] == [
        [h.score for h in row[:3]] for row in everything
    ]
    assert not {h.id for row in top for h in row} & deleted

    path = tmp_path_factory.mktemp("index")
    index.save(path)
    index.save(path)  # saving again replaces the files
    assert sorted(p.name for p in path.iterdir()) == [
        f"graph-{index.version}.usearch",
        "manifest.json",
        f"vectors-{index.version}.npz",
    ]
    reloaded = ApproximateIndex.load(path)
    assert (reloaded.version, reloaded.ids, reloaded.expansion_search) == (
        index.version,
        index.ids,
        64,
    )
    assert reloaded.search_embeddings(queries, 3) == top
    reloaded.add(["new"], [[9.0, 9.0, 9.0]])  # under a new key, not one the graph holds
    assert [h.id for h in reloaded.search_embeddings([[1.0, 1.0, 1.0]], 1)[0]] == ["new"]


def test_bad_input_is_named(tmp_path, monkeypatch):
    index = ApproximateIndex(metric="cosine")
    assert index.search_embeddings(np.zeros((2, 0)), 3) == [[], []]  # empty: no dimension yet
    index.add(["a", "b"], [[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="3 dimensions, the index 2"):
        index.add(["c"], [[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match=r"need \[Q, 2\] queries"):
        index.search_embeddings([[1.0, 0.0, 0.0]], 1)
    with pytest.raises(ValueError, match="k must be at least 1"):
        index.search_embeddings([[1.0, 0.0]], 0)
    with pytest.raises(KeyError, match="not in the index"):
        index.delete(["missing"])
    with pytest.raises(KeyError, match="already in the index"):
        index.add(["a"], [[1.0, 1.0]])
    assert index.version == 1 and len(index) == 2  # failed calls changed nothing
    with pytest.raises(ValueError, match="expansion_search must be at least 1"):
        index.expansion_search = 0
    with pytest.raises(ValueError, match="connectivity must be at least 1"):
        ApproximateIndex(connectivity=0)
    with pytest.raises(ValueError, match="dtype must be one of"):
        ApproximateIndex(dtype="f64")
    index.save(tmp_path)
    with pytest.raises(ValueError, match=r"not a agentic_jax\.retrieval\.DenseIndex/1 manifest"):
        DenseIndex.load(tmp_path)  # an approximate index's files are not an exact one's
    monkeypatch.setitem(sys.modules, "usearch.index", None)  # as if usearch were not installed
    with pytest.raises(ImportError, match=r"pip install 'agentic-jax\[ann\]'"):
        ApproximateIndex()


def test_a_dense_retriever_searches_it_and_gin_configures_it():
    with gin.unlock_config():
        gin.parse_config("retrieval.ApproximateIndex.expansion_search = 7")
    try:
        index = gin.get_configurable("retrieval.ApproximateIndex")(metric="cosine")
    finally:
        gin.clear_config()
    assert index.expansion_search == 7
    index.add(["north", "east"], [[0.0, 1.0], [1.0, 0.0]])
    hits = DenseRetriever(index, lambda texts: np.array([[1.0, 0.1]])).search("go east", 2)
    assert [h.id for h in hits] == ["east", "north"]
