"""Approximate dense retrieval: a :class:`~agentic_jax.retrieval.dense.DenseIndex` that finds its
candidates in an HNSW graph instead of scoring every row.

Exact search reads all ``N`` rows for every query; a hierarchical navigable small world graph
(HNSW, Malkov & Yashunin 2018, "Efficient and robust approximate nearest neighbor search using
Hierarchical Navigable Small World graphs") links each vector to about ``connectivity`` near
neighbours on each of a few layers (sparser going up) and answers a query by greedy descent
from the top layer, keeping the ``expansion_search`` best nodes seen on the bottom one, so a
query visits roughly ``O(log N)`` nodes times that beam.  The answer can miss true neighbours:
recall rises with ``expansion_search`` (and with ``connectivity`` and ``expansion_add``, the
beam used while building), and so does the time per query.  ``bench/approximate_index.py``
measures the trade against exact search; docs/retrieval.md has its table.

The graph is `usearch <https://github.com/unum-cloud/usearch>`_'s (an optional dependency, the
``ann`` extra), kept on the host beside the exact rows: every ``add``, ``update`` and ``delete``
changes both, so ids, versions, saving and loading are the :class:`DenseIndex`'s.  The graph
only proposes the candidates; their scores are computed again from the float32 rows with the
exact formula (``dot`` or ``cosine``) and ranked with the exact tie rule (the earlier-added id
first), so a hit's score is the one exact search gives it (to float32 rounding: numpy's sum,
not XLA's), whatever precision the graph stores (``dtype``), and the hits can be fused with any
other ranking.

Vectors are linked into the graph one at a time (``threads=1``): concurrent inserts make the
graph, and so which neighbours a search finds, depend on thread scheduling, and an index must
answer the same query the same way every run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gin
import numpy as np

from agentic_jax.files import atomic_write
from agentic_jax.retrieval.dense import DenseIndex
from agentic_jax.retrieval.retriever import Hit, ranked

DTYPES = ("f32", "f16", "bf16", "i8")
_USEARCH_METRIC = {"dot": "ip", "cosine": "cos"}


def usearch_index_class():
    """usearch's ``Index``, or an ImportError saying how to install it."""
    try:
        from usearch.index import Index
    except ImportError as error:
        raise ImportError(
            "ApproximateIndex needs usearch, the `ann` extra: pip install 'agentic-jax[ann]'"
        ) from error
    return Index


@gin.configurable(module="retrieval")
class ApproximateIndex(DenseIndex):
    """Embeddings by id, searched approximately through an HNSW graph (see the module docstring).

    ``connectivity`` (HNSW's ``M``): links per node, more for higher recall and memory;
    ``expansion_add`` (``efConstruction``): the beam while inserting, more for a better graph
    and slower adds; ``expansion_search`` (``ef``): the beam while searching, the knob that
    trades recall for speed, settable at any time (``index.expansion_search = 128``);
    ``dtype``: the precision the graph stores its copy of the vectors in (``f32``, ``f16``,
    ``bf16``, ``i8``), which moves only which candidates are found, never their scores.
    Host-side: no mesh.
    """

    FORMAT = "agentic_jax.retrieval.ApproximateIndex/1"

    def __init__(
        self,
        dim: int | None = None,
        *,
        metric: str = "cosine",
        connectivity: int = 16,
        expansion_add: int = 128,
        expansion_search: int = 64,
        dtype: str = "f32",
    ):
        usearch_index_class()  # fail now, not at the first add
        super().__init__(dim, metric=metric)
        for name, value in [
            ("connectivity", connectivity),
            ("expansion_add", expansion_add),
            ("expansion_search", expansion_search),
        ]:
            if value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
        self.connectivity, self.expansion_add, self.dtype = connectivity, expansion_add, dtype
        self._expansion_search = expansion_search
        self._graph = None  # made once the dimension is known
        self._make_graph()
        self._keys: dict[str, int] = {}  # the graph's integer key of each live id
        self._id_of: dict[int, str] = {}
        self._next_key = 0

    @property
    def expansion_search(self) -> int:
        return self._expansion_search

    @expansion_search.setter
    def expansion_search(self, value: int) -> None:
        if value < 1:
            raise ValueError(f"expansion_search must be at least 1, got {value}")
        self._expansion_search = value
        if self._graph is not None:
            self._graph.expansion_search = value

    def _make_graph(self) -> None:
        if self._graph is None and self.dim is not None:
            self._graph = usearch_index_class()(
                ndim=self.dim,
                metric=_USEARCH_METRIC[self.metric],
                dtype=self.dtype,
                connectivity=self.connectivity,
                expansion_add=self.expansion_add,
                expansion_search=self._expansion_search,
            )

    def _graph_keys(self, ids: list[str]) -> np.ndarray:
        return np.array([self._keys[i] for i in ids], np.uint64)

    def add(self, ids, embeddings) -> None:
        """New rows, linked into the graph; an id already present is an error (``update`` it)."""
        ids = [str(i) for i in ids]
        super().add(ids, embeddings)
        self._make_graph()
        keys = range(self._next_key, self._next_key + len(ids))
        self._next_key += len(ids)
        self._keys.update(zip(ids, keys))
        self._id_of.update(zip(keys, ids))
        self._graph.add(self._graph_keys(ids), self.embeddings(ids), threads=1)

    def update(self, ids, embeddings) -> None:
        """New embeddings for present ids: each is unlinked and inserted again, under its key."""
        ids = [str(i) for i in ids]
        super().update(ids, embeddings)
        keys = self._graph_keys(ids)
        self._graph.remove(keys)
        self._graph.add(keys, self.embeddings(ids), threads=1)

    def delete(self, ids) -> None:
        """Removes ids from the rows and the graph (usearch marks the nodes deleted: they still
        route searches but are never returned)."""
        ids = list(dict.fromkeys(map(str, ids)))
        super().delete(ids)
        if ids:  # present, so the graph exists
            self._graph.remove(self._graph_keys(ids))
        for i in ids:
            del self._id_of[self._keys.pop(i)]

    def search_embeddings(self, queries, k: int) -> list[list[Hit]]:
        """The (at most) ``k`` best hits the graph finds for each row of ``queries``
        (``[Q, dim]``), scored exactly; fewer than ``k`` only when the index holds fewer."""
        queries = self._checked_queries(queries, k)
        k = min(k, len(self))
        if k == 0:
            return [[] for _ in queries]
        found = self._graph.search(queries, k)
        keys, counts = (
            (found.keys, found.counts)
            if len(queries) > 1
            else (found.keys[None], [len(found.keys)])  # usearch unbatches a single query
        )
        hits = []
        for query, row_keys, count in zip(queries, keys, counts):
            rows = np.array([self._rows[self._id_of[int(key)]] for key in row_keys[:count]], int)
            vectors = self._vectors[rows]
            if self.metric == "cosine":
                vectors, query = (
                    x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
                    for x in (vectors, query)
                )
            scores = vectors @ query
            order = np.lexsort((rows, -scores))
            hits.append(ranked((self._ids[rows[o]], scores[o]) for o in order))
        return hits

    def _write_files(self, path: Path) -> dict[str, str]:
        files = super()._write_files(path)
        if self._graph is not None:
            files["graph"] = f"graph-{self.version}.usearch"
            with atomic_write(path / files["graph"], "wb") as f:
                f.write(self._graph.save())
        return files

    def _manifest(self) -> dict[str, Any]:
        return {
            **super()._manifest(),
            "keys": [self._keys[i] for i in self.ids],
            "next_key": self._next_key,
            "hnsw": dict(
                connectivity=self.connectivity,
                expansion_add=self.expansion_add,
                expansion_search=self._expansion_search,
                dtype=self.dtype,
            ),
        }

    def _restore(self, path: Path, manifest: dict[str, Any]) -> None:
        """The rows, and the saved graph itself (not one built again: a graph depends on the
        order of its inserts and deletes, so only the saved one searches identically)."""
        super()._restore(path, manifest)
        self._keys = dict(zip(manifest["ids"], manifest["keys"]))
        self._id_of = {key: i for i, key in self._keys.items()}
        self._next_key = manifest["next_key"]
        if "graph" in manifest:
            self._graph = usearch_index_class().restore(path / manifest["graph"])
            self._graph.expansion_add = self.expansion_add
            self._graph.expansion_search = self._expansion_search

    @classmethod
    def load(cls, path: str | Path) -> ApproximateIndex:
        """The index ``save`` wrote to ``path``: the same rows, keys and graph."""
        path = Path(path)
        manifest = cls._read_manifest(path)
        index = cls(manifest["dim"], metric=manifest["metric"], **manifest["hnsw"])
        index._restore(path, manifest)
        return index
