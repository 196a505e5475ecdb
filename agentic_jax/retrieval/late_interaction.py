"""Late interaction (ColBERT): token vectors scored by MaxSim, stored compressed (ColBERTv2) and
searched through centroids (PLAID), all in JAX.

* **MaxSim** (Khattab & Zaharia 2020, "ColBERT", arXiv:2004.12832): a query and a passage are
  each a bag of unit token vectors, and ``S(q, d) = Σ_{i ∈ q} max_{j ∈ d} q_i · d_j`` over their
  real (mask) tokens: each query token finds its best match, so a passage is judged on the
  query's every term without squeezing either text into one vector.
* **Residual compression** (Santhanam et al. 2022, "ColBERTv2", arXiv:2112.01488): k-means
  centroids ``C`` of the passages' token vectors; a vector ``v`` is kept as its nearest
  centroid's index ``c(v)`` and its residual ``r = v − C[c(v)]`` at ``b`` bits a dimension.  The
  ``2^b`` buckets are cut at the quantiles ``k / 2^b`` of the fitted residual values, a value is
  stored as its bucket and read back as the bucket's weight (the quantile ``(k + ½) / 2^b``,
  inside the bucket), so a value within the fitted range comes back within its bucket's width
  (:func:`quantisation_bound`).  ``D·b / 8`` bytes a vector instead of ``4·D``.
* **Centroid-pruned search** (Santhanam et al. 2022, "PLAID", arXiv:2205.09707): each query
  token probes its ``nprobe`` nearest centroids and only passages holding a token of a probed
  centroid are candidates (a centroid most passages hold, like the one of every ``BOS``, selects
  nothing and is not counted); candidates are ranked by centroid interaction (MaxSim with each
  passage token replaced by its centroid: a ``[Lq, C]`` table, no decompression) and the best
  ``max_candidates`` are decompressed and scored exactly.  When every passage of the exact top k
  holds a probed centroid and survives the cut, the result is the exact MaxSim top k.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from agentic_jax.retrieval.retriever import Hit, check_k, ranked


@jax.jit
def maxsim_scores(q, q_mask, d, d_mask) -> jax.Array:
    """``[B, N]``: MaxSim of queries ``q [B, Lq, D]`` against passages ``d [N, Ld, D]`` (masks
    ``[B, Lq]`` and ``[N, Ld]``; a passage needs at least one real token)."""
    sims = jnp.einsum("bqd,npd->bnqp", q, d)
    sims = jnp.where(jnp.asarray(d_mask, bool)[None, :, None, :], sims, -jnp.inf)
    best = jnp.max(sims, axis=-1)
    return jnp.sum(jnp.where(jnp.asarray(q_mask, bool)[:, None, :], best, 0.0), axis=-1)


def nearest(x, centroids) -> jax.Array:
    """``[M]`` int32: the index of each row of ``x [M, D]``'s nearest centroid (Euclidean)."""
    distance = jnp.sum(centroids**2, axis=1) - 2 * x @ centroids.T
    return jnp.argmin(distance, axis=1).astype(jnp.int32)


def _plus_plus(x, k: int, key) -> jax.Array:
    """k-means++ seeding (Arthur & Vassilvitskii 2007): each next centroid is a row drawn with
    probability proportional to its squared distance from the nearest centroid so far, so the
    start spreads over the clusters instead of doubling up in one."""
    keys = jax.random.split(key, k)
    first = x[jax.random.randint(keys[0], (), 0, x.shape[0])]
    centroids = jnp.zeros((k, x.shape[1]), x.dtype).at[0].set(first)

    def add(i, carry):
        centroids, distance = carry
        chosen = x[jax.random.categorical(keys[i], jnp.log(distance))]
        distance = jnp.minimum(distance, jnp.sum((x - chosen) ** 2, axis=1))
        return centroids.at[i].set(chosen), distance

    start = (centroids, jnp.sum((x - first) ** 2, axis=1))
    return jax.lax.fori_loop(1, k, add, start)[0]


@functools.partial(jax.jit, static_argnames=("k", "iterations"))
def kmeans(x, k: int, key, iterations: int = 20) -> jax.Array:
    """``[k, D]`` centroids of ``x [M, D]`` (M ≥ k) by Lloyd's algorithm (Lloyd 1982) from a
    k-means++ start: ``iterations`` times, assign every row to its nearest centroid and move
    each centroid to its rows' mean (an empty cluster stays where it is)."""

    def step(centroids, _):
        assign = nearest(x, centroids)
        sums = jax.ops.segment_sum(x, assign, k)
        counts = jax.ops.segment_sum(jnp.ones(x.shape[0], x.dtype), assign, k)
        moved = sums / jnp.maximum(counts, 1)[:, None]
        return jnp.where(counts[:, None] > 0, moved, centroids), None

    return jax.lax.scan(step, _plus_plus(x, k, key), None, length=iterations)[0]


class ResidualCodec(NamedTuple):
    """Centroids ``[C, D]`` and the residual buckets: ``edges [2^b + 1]`` (the fitted minimum,
    the ``2^b − 1`` cuts, the fitted maximum) and ``weights [2^b]`` (a bucket's decoded value)."""

    centroids: jax.Array
    edges: jax.Array
    weights: jax.Array

    @property
    def bits(self) -> int:
        return int(self.weights.shape[0]).bit_length() - 1


@functools.partial(jax.jit, static_argnames=("num_centroids", "bits", "iterations"))
def fit_codec(
    vectors, key, *, num_centroids: int, bits: int = 2, iterations: int = 20
) -> ResidualCodec:
    """A :class:`ResidualCodec` fitted on token vectors ``[M, D]`` (see the module docstring);
    ``bits`` in 1, 2, 4, 8 so that codes pack into bytes."""
    if bits not in (1, 2, 4, 8):
        raise ValueError(f"bits={bits}; expected 1, 2, 4 or 8")
    centroids = kmeans(vectors, num_centroids, key, iterations)
    residuals = (vectors - centroids[nearest(vectors, centroids)]).ravel()
    levels = 2**bits
    edges = jnp.quantile(residuals, jnp.arange(levels + 1) / levels)
    weights = jnp.quantile(residuals, (jnp.arange(levels) + 0.5) / levels)
    return ResidualCodec(centroids, edges, weights)


def quantisation_bound(codec: ResidualCodec) -> jax.Array:
    """The most a decompressed dimension can be off, for a residual in the fitted range: the
    widest bucket."""
    return jnp.max(jnp.diff(codec.edges))


def _pack(buckets, bits: int):
    """``[..., D]`` bucket indices -> ``[..., D·bits/8]`` uint8, ``8 / bits`` to a byte."""
    per_byte = 8 // bits
    grouped = buckets.reshape(*buckets.shape[:-1], -1, per_byte).astype(jnp.uint8)
    return jnp.sum(
        grouped << (bits * jnp.arange(per_byte, dtype=jnp.uint8)), axis=-1, dtype=jnp.uint8
    )


def _unpack(packed, bits: int):
    per_byte = 8 // bits
    shifts = bits * jnp.arange(per_byte, dtype=jnp.uint8)
    buckets = (packed[..., None] >> shifts) & jnp.uint8(2**bits - 1)
    return buckets.reshape(*packed.shape[:-1], -1).astype(jnp.int32)


@jax.jit
def compress(codec: ResidualCodec, vectors) -> tuple[jax.Array, jax.Array]:
    """``(codes [...], packed residuals [..., D·b/8] uint8)`` of vectors ``[..., D]``."""
    flat = vectors.reshape(-1, vectors.shape[-1])
    codes = nearest(flat, codec.centroids)
    buckets = jnp.searchsorted(codec.edges[1:-1], flat - codec.centroids[codes], side="right")
    packed = _pack(buckets, codec.bits)
    return codes.reshape(vectors.shape[:-1]), packed.reshape(*vectors.shape[:-1], -1)


@jax.jit
def decompress(codec: ResidualCodec, codes, packed) -> jax.Array:
    """Vectors ``[..., D]``: each code's centroid plus its residual's bucket weights."""
    return codec.centroids[codes] + codec.weights[_unpack(packed, codec.bits)]


def compression_error(codec: ResidualCodec, vectors) -> dict[str, float]:
    """How far ``decompress(compress(v))`` is from ``v [M, D]``: mean squared and largest
    per-dimension error, mean cosine, and bytes a vector (codes as int32) against float32."""
    restored = decompress(codec, *compress(codec, vectors))
    error = restored - vectors
    cosine = jnp.sum(restored * vectors, -1) / (
        jnp.linalg.norm(restored, axis=-1) * jnp.linalg.norm(vectors, axis=-1) + 1e-12
    )
    dim = vectors.shape[-1]
    return {
        "mean_squared_error": float(jnp.mean(error**2)),
        "max_abs_error": float(jnp.max(jnp.abs(error))),
        "mean_cosine": float(jnp.mean(cosine)),
        "bytes_per_vector": dim * codec.bits / 8 + 4,
        "compression_ratio": 4 * dim / (dim * codec.bits / 8 + 4),
    }


class LateInteractionIndex(NamedTuple):
    """Passages' token vectors, compressed: ``codes [N, L]``, ``residuals [N, L, D·b/8]``,
    ``mask [N, L]`` (real tokens), and ``holders [C]``, how many passages hold each centroid."""

    codec: ResidualCodec
    codes: jax.Array
    residuals: jax.Array
    mask: jax.Array
    holders: jax.Array


def build_index(codec: ResidualCodec, vectors, mask) -> LateInteractionIndex:
    """The index of passages' token vectors ``[N, L, D]`` with their ``mask [N, L]``."""
    codes, residuals = compress(codec, jnp.asarray(vectors))
    mask = jnp.asarray(mask, bool)
    count = codec.centroids.shape[0]
    ordered = jnp.sort(jnp.where(mask, codes, count), axis=1)  # a passage's centroids, then C
    first = ordered != jnp.pad(ordered, ((0, 0), (1, 0)), constant_values=-1)[:, :-1]
    holders = jnp.zeros(count + 1, jnp.int32).at[ordered].add(first.astype(jnp.int32))[:count]
    return LateInteractionIndex(codec, codes, residuals, mask, holders)


@functools.partial(jax.jit, static_argnames=("k", "nprobe", "max_candidates"))
def search(
    index: LateInteractionIndex,
    q,
    q_mask,
    *,
    k: int,
    nprobe: int,
    max_candidates: int,
    max_share: float = 0.5,
):
    """``(scores [B, k], ids [B, k], candidates [B])`` for queries ``q [B, Lq, D]``: the PLAID
    pipeline of the module docstring (``nprobe`` ≤ the centroids, ``k`` ≤ ``max_candidates`` ≤
    the passages).  A centroid held by more than ``max_share`` of the passages (the one every
    ``BOS`` falls in, a stop word's) selects nothing, so it makes no candidates, though it
    still counts in the centroid interaction.  ``candidates`` counts the passages selected.
    Slots beyond the candidates score −inf."""
    common = index.holders > max_share * index.codes.shape[0]

    def one(q, q_mask):
        table = q @ index.codec.centroids.T  # [Lq, C]: every query token against every centroid
        probed = jax.lax.top_k(table, nprobe)[1]
        hit = jnp.zeros(table.shape[1], jnp.int32).at[probed].add(q_mask[:, None].astype(jnp.int32))
        candidate = jnp.any(((hit > 0) & ~common)[index.codes] & index.mask, axis=1)
        approx = jnp.where(index.mask[None], table[:, index.codes], -jnp.inf)  # [Lq, N, L]
        approx = jnp.sum(jnp.where(q_mask[:, None], jnp.max(approx, -1), 0.0), axis=0)
        _, shortlist = jax.lax.top_k(jnp.where(candidate, approx, -jnp.inf), max_candidates)
        vectors = decompress(index.codec, index.codes[shortlist], index.residuals[shortlist])
        exact = maxsim_scores(q[None], q_mask[None], vectors, index.mask[shortlist])[0]
        exact = jnp.where(candidate[shortlist], exact, -jnp.inf)
        scores, best = jax.lax.top_k(exact, k)
        return scores, shortlist[best], jnp.sum(candidate)

    return jax.vmap(one)(q, jnp.asarray(q_mask, bool))


class LateInteractionRetriever:
    """A :class:`~agentic_jax.retrieval.retriever.Retriever` over a :class:`LateInteractionIndex`:
    ``encode(queries) -> (vectors [B, Lq, D], mask [B, Lq])`` turns a query into token vectors
    (e.g. ``encoders.Encoder.encode_queries`` of a ``pooling="tokens"`` encoder)."""

    def __init__(
        self,
        index: LateInteractionIndex,
        ids: Sequence[str],
        encode: Callable[[list[str]], tuple[np.ndarray, np.ndarray]],
        *,
        nprobe: int = 4,
        max_candidates: int = 256,
    ):
        if len(ids) != index.codes.shape[0]:
            raise ValueError(f"{len(ids)} ids for {index.codes.shape[0]} indexed passages")
        self.index, self.ids, self.encode = index, [str(i) for i in ids], encode
        self.nprobe = min(nprobe, index.codec.centroids.shape[0])
        self.max_candidates = min(max_candidates, len(ids))

    def search(self, query: str, k: int) -> list[Hit]:
        check_k(k)
        vectors, mask = self.encode([query])
        scores, best, _ = search(
            self.index,
            jnp.asarray(vectors),
            jnp.asarray(mask),
            k=min(k, self.max_candidates),
            nprobe=self.nprobe,
            max_candidates=self.max_candidates,
        )
        return ranked(
            (self.ids[i], s)
            for i, s in zip(np.asarray(best[0]), np.asarray(scores[0]))
            if s > -np.inf
        )
