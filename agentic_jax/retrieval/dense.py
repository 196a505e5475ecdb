"""Exact dense retrieval in JAX: the ``k`` corpus rows nearest a batch of query embeddings.

A query ``q`` scores a row ``d`` by ``q · d`` (``dot``, for encoders trained with a dot product)
or ``q · d / (|q| |d|)`` (``cosine``), all rows at once as ``queries @ corpus.T`` in float32 at
full precision, and ``jax.lax.top_k`` picks the best.  Equal scores rank by row, the lower row
first (``lax.top_k``'s rule); a :class:`DenseIndex`'s rows are in the order ids were first
added, so ties go to the earlier-added id.

Over a mesh the corpus's rows are split across devices: each device ranks its own rows (in
``shard_map``), and one more ``top_k`` over the ``k`` best of every device merges them.  Each
device's list is in (score, row) order and the devices hold consecutive blocks of rows, so the
merge breaks ties by row too: given the same scores, a sharded search ranks exactly as an
unsharded one.

Embeddings come from anywhere (``[N, D]`` arrays): the encoders of this package, or any other.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from agentic_jax.files import atomic_write
from agentic_jax.retrieval.retriever import Hit, check_k, ranked

METRICS = ("cosine", "dot")
MANIFEST = "manifest.json"


def _scores(queries: jax.Array, corpus: jax.Array, metric: str) -> jax.Array:
    if metric == "cosine":
        queries, corpus = (
            x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
            for x in (queries, corpus)
        )
    return jnp.matmul(queries, corpus.T, precision=jax.lax.Precision.HIGHEST)


def _local_top_k(queries, corpus, valid, k: int, metric: str):
    scores = jnp.where(valid, _scores(queries, corpus, metric), -jnp.inf)
    return jax.lax.top_k(scores, k)


@functools.partial(jax.jit, static_argnames=("k", "metric", "mesh", "axes"))
def _top_k(queries, corpus, valid, *, k: int, metric: str, mesh: Mesh | None, axes):
    if mesh is None:
        return _local_top_k(queries, corpus, valid, k, metric)
    rows = corpus.shape[0] // math.prod(mesh.shape[a] for a in axes)

    def shard(queries, corpus, valid):
        scores, index = _local_top_k(queries, corpus, valid, min(k, rows), metric)
        return scores, index + jax.lax.axis_index(axes) * rows

    split = PartitionSpec(axes)
    scores, index = jax.shard_map(
        shard,
        mesh=mesh,
        in_specs=(PartitionSpec(), split, split),
        out_specs=PartitionSpec(None, axes),
    )(queries, corpus, valid)
    scores, best = jax.lax.top_k(scores, k)
    return scores, jnp.take_along_axis(index, best, axis=1)


def exact_top_k(
    queries,
    corpus,
    k: int,
    *,
    metric: str = "cosine",
    valid=None,
    mesh: Mesh | None = None,
    axes: Sequence[str] | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The scores and rows (``[Q, k]`` each) of the ``k`` best of ``corpus`` (``[N, D]``) for
    each of ``queries`` (``[Q, D]``), best first; rows where ``valid`` (``[N]``) is False score
    ``-inf``.  With a ``mesh``, rows are split over its ``axes`` (default: all of them; ``N``
    must divide by their product).  Query batches are padded to a power of two, so a stream of
    batch sizes compiles only a few times."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    queries = jnp.asarray(queries, jnp.float32)
    corpus = jnp.asarray(corpus, jnp.float32)
    if queries.ndim != 2 or corpus.ndim != 2 or queries.shape[1] != corpus.shape[1]:
        raise ValueError(
            f"need [Q, D] queries and [N, D] corpus, got {queries.shape}, {corpus.shape}"
        )
    if not 1 <= k <= corpus.shape[0]:
        raise ValueError(f"k must be in [1, {corpus.shape[0]}] for this corpus, got {k}")
    valid = jnp.ones(corpus.shape[0], bool) if valid is None else jnp.asarray(valid, bool)
    if mesh is not None:
        axes = tuple(mesh.axis_names if axes is None else axes)
        shards = math.prod(mesh.shape[a] for a in axes)
        if corpus.shape[0] % shards:
            raise ValueError(f"{corpus.shape[0]} corpus rows do not split over {shards} devices")
    n = queries.shape[0]
    padded = jnp.zeros((1 << max(n - 1, 0).bit_length(), queries.shape[1]), jnp.float32)
    scores, rows = _top_k(
        padded.at[:n].set(queries), corpus, valid, k=k, metric=metric, mesh=mesh, axes=axes
    )
    return scores[:n], rows[:n]


@gin.configurable(module="retrieval")
class DenseIndex:
    """Embeddings by id, searched exactly (see the module docstring), changed in place.

    ``add`` appends rows, ``update`` overwrites an id's row, ``delete`` marks its row dead; each
    call bumps ``version``.  Dead rows are reclaimed (live rows moved up, their order kept) when
    an ``add`` needs room, and the capacity grows to the number of devices times a power of two,
    so the shapes ``jit`` sees, and its compilations, change rarely.  ``save`` writes the live
    rows and the manifest; ``load`` gives back an index that searches identically.
    """

    FORMAT = "agentic_jax.retrieval.DenseIndex/1"

    def __init__(
        self,
        dim: int | None = None,
        *,
        metric: str = "cosine",
        mesh: Mesh | None = None,
        axes: Sequence[str] | None = None,
    ):
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        self.dim, self.metric, self.mesh = dim, metric, mesh
        self.axes = None if mesh is None else tuple(mesh.axis_names if axes is None else axes)
        self.shards = 1 if mesh is None else math.prod(mesh.shape[a] for a in self.axes)
        self.version = 0
        self._vectors = np.zeros((0, dim or 0), np.float32)  # [capacity, dim]
        self._ids: list[str | None] = []  # the id of each used row, None once deleted
        self._rows: dict[str, int] = {}
        self._device = None  # (vectors, valid) on the devices, until the next change

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, id: str) -> bool:
        return id in self._rows

    @property
    def ids(self) -> list[str]:
        """The live ids in row order (the order ties rank in)."""
        return [i for i in self._ids if i is not None]

    def embeddings(self, ids: Sequence[str]) -> np.ndarray:
        """The stored ``[len(ids), dim]`` embeddings of ``ids``."""
        return self._vectors[self._rows_of(ids)]

    def _rows_of(self, ids: Sequence[str]) -> list[int]:
        missing = [i for i in ids if i not in self._rows]
        if missing:
            raise KeyError(f"not in the index: {missing[:5]}")
        return [self._rows[i] for i in ids]

    def _checked(self, ids: Sequence[str], embeddings) -> tuple[list[str], np.ndarray]:
        ids, vectors = [str(i) for i in ids], np.asarray(embeddings, np.float32)
        if vectors.ndim != 2 or len(vectors) != len(ids):
            raise ValueError(f"need one row per id: {len(ids)} ids, embeddings {vectors.shape}")
        if self.dim is None:
            self.dim = vectors.shape[1]
            self._vectors = np.zeros((0, self.dim), np.float32)
        if vectors.shape[1] != self.dim:
            raise ValueError(f"embeddings have {vectors.shape[1]} dimensions, the index {self.dim}")
        if len(set(ids)) != len(ids):
            raise ValueError("an id appears twice in one call")
        if not np.isfinite(vectors).all():
            raise ValueError("embeddings must be finite")
        return ids, vectors

    def _changed(self) -> None:
        self.version += 1
        self._device = None

    def add(self, ids: Sequence[str], embeddings) -> None:
        """New rows; an id already present is an error (``update`` it)."""
        self._append(*self._checked(ids, embeddings))
        self._changed()

    def _append(self, ids: list[str], vectors: np.ndarray) -> None:
        """Rows for new ids, the version unchanged (``load`` restores it; a subclass's ``add``
        does more than this)."""
        present = [i for i in ids if i in self._rows]
        if present:
            raise KeyError(f"already in the index: {present[:5]}")
        self._reserve(len(ids))
        start = len(self._ids)
        self._vectors[start : start + len(ids)] = vectors
        self._ids += ids
        self._rows.update(zip(ids, range(start, start + len(ids))))

    def update(self, ids: Sequence[str], embeddings) -> None:
        """New embeddings for present ids, which keep their rows."""
        ids, vectors = self._checked(ids, embeddings)
        self._vectors[self._rows_of(ids)] = vectors
        self._changed()

    def delete(self, ids: Sequence[str]) -> None:
        ids = list(dict.fromkeys(map(str, ids)))
        for row in self._rows_of(ids):
            self._ids[row] = None
        for i in ids:
            del self._rows[i]
        self._changed()

    def _reserve(self, n: int) -> None:
        """Room for ``n`` more rows after the used ones."""
        if len(self._ids) + n <= len(self._vectors):
            return
        live = [row for row, i in enumerate(self._ids) if i is not None]
        per_shard = 1 << (math.ceil((len(live) + n) / self.shards) - 1).bit_length()
        capacity = max(len(self._vectors), self.shards * per_shard)
        vectors = np.zeros((capacity, self.dim), np.float32)
        vectors[: len(live)] = self._vectors[live]
        self._vectors, self._ids = vectors, [self._ids[row] for row in live]
        self._rows = {i: row for row, i in enumerate(self._ids)}

    def _on_device(self):
        if self._device is None:
            valid = np.zeros(len(self._vectors), bool)
            valid[: len(self._ids)] = [i is not None for i in self._ids]
            where = (
                None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec(self.axes))
            )
            self._device = jax.device_put((self._vectors, valid), where)
        return self._device

    def _checked_queries(self, queries, k: int) -> np.ndarray:
        check_k(k)
        queries = np.asarray(queries, np.float32)
        if queries.ndim != 2 or queries.shape[1] != (self.dim or queries.shape[1]):
            raise ValueError(f"need [Q, {self.dim}] queries, got {queries.shape}")
        if not np.isfinite(queries).all():
            raise ValueError("queries must be finite")
        return queries

    def search_embeddings(self, queries, k: int) -> list[list[Hit]]:
        """The (at most) ``k`` best hits for each row of ``queries`` (``[Q, dim]``)."""
        queries = self._checked_queries(queries, k)
        k = min(k, len(self))
        if k == 0:
            return [[] for _ in queries]
        vectors, valid = self._on_device()
        scores, rows = exact_top_k(
            queries, vectors, k, metric=self.metric, valid=valid, mesh=self.mesh, axes=self.axes
        )
        return [
            ranked((self._ids[r], s) for r, s in zip(row, score))
            for row, score in zip(np.asarray(rows), np.asarray(scores))
        ]

    def save(self, path: str | Path) -> None:
        """Writes ``path/vectors-<version>.npz`` (the live rows, in order), then
        ``path/manifest.json`` naming it, each atomically: the manifest is written last, so a
        crash leaves the previous index readable.  Older ``vectors-*.npz`` are then removed."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        files = self._write_files(path)
        with atomic_write(path / MANIFEST, encoding="utf-8") as f:
            json.dump({**self._manifest(), **files}, f)
        for field, name in files.items():
            for old in path.glob(f"{field}-*{Path(name).suffix}"):
                if old.name != name:
                    old.unlink(missing_ok=True)

    def _write_files(self, path: Path) -> dict[str, str]:
        """Writes the files the manifest names, atomically: ``{field: file name}``, each name
        ``<field>-<version><suffix>`` (older ones are removed once the manifest is written)."""
        name = f"vectors-{self.version}.npz"
        with atomic_write(path / name, "wb") as f:
            np.savez(f, vectors=self.embeddings(self.ids))
        return {"vectors": name}

    def _manifest(self) -> dict[str, Any]:
        return dict(
            format=self.FORMAT, version=self.version, metric=self.metric, dim=self.dim, ids=self.ids
        )

    @classmethod
    def _read_manifest(cls, path: Path) -> dict[str, Any]:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        if manifest.get("format") != cls.FORMAT:
            raise ValueError(f"{path / MANIFEST} is not a {cls.FORMAT} manifest")
        return manifest

    def _restore(self, path: Path, manifest: dict[str, Any]) -> None:
        """The rows and version of a manifest ``_read_manifest`` read from ``path``."""
        with np.load(path / manifest["vectors"]) as data:
            vectors = data["vectors"]
        if manifest["ids"]:
            self._append(*self._checked(manifest["ids"], vectors))
        self.version = manifest["version"]

    @classmethod
    def load(
        cls, path: str | Path, *, mesh: Mesh | None = None, axes: Sequence[str] | None = None
    ) -> DenseIndex:
        """The index ``save`` wrote to ``path``, placed on ``mesh`` (which may differ from the
        one it was saved from)."""
        path = Path(path)
        manifest = cls._read_manifest(path)
        index = cls(manifest["dim"], metric=manifest["metric"], mesh=mesh, axes=axes)
        index._restore(path, manifest)
        return index


@gin.configurable(module="retrieval")
class DenseRetriever:
    """Text search over a :class:`DenseIndex` (exact) or an ``ApproximateIndex`` (one, searched
    through its HNSW graph): ``encode`` (a list of strings to an ``[n, D]`` array; any encoder)
    embeds the query."""

    def __init__(self, index: DenseIndex, encode: Callable[[list[str]], Any]):
        self.index, self.encode = index, encode

    def search(self, query: str, k: int) -> list[Hit]:
        return self.index.search_embeddings(self.encode([query]), k)[0]
