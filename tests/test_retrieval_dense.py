"""Exact dense top-k: against numpy, sharded over the 8 fake devices, and an index changed in place,
saved and reloaded."""

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.retrieval import DenseIndex, DenseRetriever, exact_top_k
from sharding import make_mesh

MESH = make_mesh({"data": 2, "tensor": 4})  # all 8 fake devices (tests/conftest.py)


def reference_top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Rows by score, best first, equal scores by row (the documented tie rule)."""
    return np.stack([np.lexsort((np.arange(len(row)), -row))[:k] for row in scores])


# Small integers make dot products exact in float32, so there are many exact ties.
def integer_arrays(rows, dim):
    return st.lists(
        st.lists(st.integers(-2, 2), min_size=dim, max_size=dim), min_size=rows, max_size=rows
    ).map(lambda x: np.array(x, np.float32))


@st.composite
def problems(draw):
    n, q = draw(st.integers(1, 24)), draw(st.integers(1, 3))
    k = min(n, draw(st.sampled_from([1, 3, 8])))
    return draw(integer_arrays(q, 3)), draw(integer_arrays(n, 3)), k


@given(problems())
def test_dot_top_k_is_numpy_argsort_with_ties_by_row_sharded_or_not(problem):
    queries, corpus, k = problem
    expected = reference_top_k(queries @ corpus.T, k)
    # The index pads the corpus to a multiple of the devices; sharded equals unsharded.
    ids = [f"c{i}" for i in range(len(corpus))]
    for mesh in (None, MESH):
        index = DenseIndex(metric="dot", mesh=mesh)
        index.add(ids, corpus)
        hits = index.search_embeddings(queries, k)
        assert [[h.id for h in row] for row in hits] == [[ids[i] for i in r] for r in expected]
        assert [[h.rank for h in row] for row in hits] == [list(range(1, k + 1))] * len(queries)
        scores = np.take_along_axis(queries @ corpus.T, expected, 1)
        assert [[h.score for h in row] for row in hits] == scores.tolist()


@given(st.integers(0, 2**31 - 1), st.sampled_from([1, 5]))
def test_cosine_top_k_is_a_true_top_k(seed, k):
    rng = np.random.default_rng(seed)
    n = 37
    queries, corpus = (
        rng.normal(size=(3, 6)),
        rng.normal(size=(n, 6)) * rng.uniform(0.1, 10, (n, 1)),
    )
    cosine = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (
        corpus / np.linalg.norm(corpus, axis=1, keepdims=True)
    ).T
    padded = np.concatenate([corpus, np.zeros((-n % 8, 6))])  # rows that split over 8 devices
    valid = np.arange(len(padded)) < n
    for mesh in (None, MESH):
        scores, rows = map(np.asarray, exact_top_k(queries, padded, k, valid=valid, mesh=mesh))
        assert (rows < n).all()
        np.testing.assert_allclose(scores, np.take_along_axis(cosine, rows, 1), atol=1e-5)
        # Best first, and nothing left out scores better than the last one kept (to rounding).
        assert (np.diff(scores, axis=1) <= 1e-6).all()
        np.testing.assert_allclose(scores[:, -1], np.sort(cosine, axis=1)[:, -k], atol=1e-5)


operations = st.lists(
    st.tuples(
        st.sampled_from(["add", "update", "delete"]),
        st.lists(st.integers(0, 11), min_size=1, max_size=4, unique=True),
        st.integers(0, 2**31 - 1),
    ),
    max_size=12,
)


@given(operations)
def test_changed_saved_and_reloaded_index_searches_like_a_rebuild(tmp_path_factory, ops):
    index, truth, version = DenseIndex(3, metric="dot"), {}, 0
    for op, keys, seed in ops:
        ids = [f"doc{key}" for key in keys]
        vectors = np.random.default_rng(seed).integers(-3, 4, (len(ids), 3)).astype(np.float32)
        present = [i in truth for i in ids]
        if op == "add" and not any(present):
            index.add(ids, vectors)
            truth.update(zip(ids, vectors))
        elif op == "update" and all(present):
            index.update(ids, vectors)
            truth.update(zip(ids, vectors))
        elif op == "delete" and all(present):
            index.delete(ids)
            for i in ids:
                del truth[i]
        else:  # an add of a present id, an update or delete of a missing one
            with pytest.raises(KeyError):
                getattr(index, op)(*([ids, vectors] if op != "delete" else [ids]))
            continue
        version += 1
        assert index.version == version
    assert sorted(index.ids) == sorted(truth) and len(index) == len(truth)

    path = tmp_path_factory.mktemp("index")
    index.save(path)
    index.save(path)  # saving again replaces the files
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["version"] == index.version and manifest["ids"] == index.ids
    assert sorted(p.name for p in path.iterdir()) == ["manifest.json", manifest["vectors"]]
    reloaded = DenseIndex.load(path)
    sharded = DenseIndex.load(path, mesh=MESH)
    rebuilt = DenseIndex(3, metric="dot")
    if truth:
        rebuilt.add(index.ids, [truth[i] for i in index.ids])  # rows in the index's order
    assert reloaded.version == index.version and reloaded.ids == index.ids

    queries = np.random.default_rng(len(ops)).integers(-3, 4, (4, 3)).astype(np.float32)
    expected = rebuilt.search_embeddings(queries, 5)
    for other in (index, reloaded, sharded):
        assert other.search_embeddings(queries, 5) == expected
    if truth:
        np.testing.assert_array_equal(reloaded.embeddings(index.ids), [truth[i] for i in index.ids])


def test_capacity_grows_by_powers_of_two_and_dead_rows_are_reclaimed():
    index = DenseIndex(2, metric="dot", mesh=MESH)
    index.add(["a", "b", "c"], np.eye(3, 2))
    assert len(index._vectors) == 8  # one row per device
    index.add([f"x{i}" for i in range(6)], np.ones((6, 2)))
    assert len(index._vectors) == 16
    index.delete(["a", "x0", "x1", "x2"])
    index.add([f"y{i}" for i in range(10)], np.zeros((10, 2)))  # room once the dead rows go
    assert len(index._vectors) == 16
    assert index.ids == ["b", "c", "x3", "x4", "x5"] + [f"y{i}" for i in range(10)]
    assert [h.id for h in index.search_embeddings([[0.0, 1.0]], 2)[0]] == ["b", "x3"]


def test_bad_input_is_named(tmp_path):
    index = DenseIndex(metric="cosine")
    assert index.search_embeddings(np.zeros((2, 0)), 3) == [[], []]  # empty: no dimension yet
    index.add(["a"], [[1.0, 0.0]])
    with pytest.raises(ValueError, match="3 dimensions, the index 2"):
        index.add(["b"], [[1.0, 0.0, 0.0]])
    with pytest.raises(ValueError, match="finite"):
        index.add(["b"], [[np.nan, 0.0]])
    with pytest.raises(ValueError, match="twice"):
        index.add(["b", "b"], np.ones((2, 2)))
    with pytest.raises(ValueError, match="metric"):
        DenseIndex(metric="l2")
    with pytest.raises(ValueError, match="k must be at least 1"):
        index.search_embeddings([[1.0, 0.0]], 0)
    with pytest.raises(ValueError, match="do not split over 8 devices"):
        exact_top_k(np.ones((1, 2)), np.ones((3, 2)), 1, mesh=MESH)
    (tmp_path / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match=r"not a agentic_jax\.retrieval\.DenseIndex/1 manifest"):
        DenseIndex.load(tmp_path)


def test_dense_retriever_embeds_the_query_text():
    index = DenseIndex(metric="cosine")
    index.add(["north", "east"], [[0.0, 1.0], [1.0, 0.0]])
    encoded = []

    def encode(texts):
        encoded.extend(texts)
        return np.array([[1.0, 0.1] if "east" in t else [0.0, 1.0] for t in texts])

    hits = DenseRetriever(index, encode).search("go east", 1)
    assert encoded == ["go east"] and [h.id for h in hits] == ["east"]
