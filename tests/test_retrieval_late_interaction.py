"""Late interaction: MaxSim against numpy, residual compression within its quantisation bound,
and centroid-pruned (PLAID) search equal to the exact MaxSim top k on fewer candidates."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentic_jax.retrieval.late_interaction import (
    LateInteractionRetriever,
    build_index,
    compress,
    compression_error,
    decompress,
    fit_codec,
    maxsim_scores,
    quantisation_bound,
    search,
)


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


@given(
    st.integers(1, 3),
    st.integers(1, 4),
    st.integers(1, 4),
    st.integers(1, 5),
    st.integers(1, 6),
    st.integers(0, 2**31 - 1),
)
def test_maxsim_matches_numpy(queries, q_len, passages, d_len, dim, seed):
    rng = np.random.default_rng(seed)
    q, d = rng.normal(size=(queries, q_len, dim)), rng.normal(size=(passages, d_len, dim))
    q_mask = rng.random((queries, q_len)) < 0.7
    d_mask = rng.random((passages, d_len)) < 0.7
    d_mask[:, 0] = True  # a passage has a token
    want = np.zeros((queries, passages))
    for b in range(queries):
        for n in range(passages):
            sims = q[b][q_mask[b]] @ d[n][d_mask[n]].T
            want[b, n] = sims.max(axis=1).sum() if len(sims) else 0.0
    got = maxsim_scores(q.astype(np.float32), q_mask, d.astype(np.float32), d_mask)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)


def clustered(groups=4, per_group=6, length=8, dim=16, seed=0):
    """Passages whose first token is one shared vector (a ``BOS``) and whose others lie near two
    centres of their group: ``(vectors, mask)``."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(2 * groups + 1, dim))
    vectors = np.zeros((groups * per_group, length, dim), np.float32)
    for n in range(len(vectors)):
        picks = centres[2 * (n // per_group) + rng.integers(0, 2, length)]
        vectors[n] = unit(picks + 0.1 * rng.normal(size=(length, dim)))
        vectors[n, 0] = unit(centres[-1])
    mask = np.ones(vectors.shape[:2], bool)
    mask[:, -2:] = rng.random((len(vectors), 2)) < 0.5
    return vectors, mask


@pytest.mark.parametrize("bits", [2, 8])
def test_decompressed_vectors_are_within_the_quantisation_bound(bits):
    vectors, mask = clustered()
    tokens = jnp.asarray(vectors[mask])
    codec = fit_codec(tokens, jax.random.key(0), num_centroids=8, bits=bits)
    codes, packed = compress(codec, tokens)
    assert packed.dtype == jnp.uint8 and packed.shape == (len(tokens), 16 * bits // 8)
    error = np.abs(np.asarray(decompress(codec, codes, packed)) - vectors[mask])
    assert error.max() <= float(quantisation_bound(codec)) + 1e-6
    stats = compression_error(codec, tokens)
    assert stats["max_abs_error"] == pytest.approx(error.max(), rel=1e-5)
    assert stats["compression_ratio"] == pytest.approx(64 / (2 * bits + 4))
    assert stats["mean_cosine"] > (0.99 if bits == 8 else 0.9)


def test_centroid_pruned_search_returns_the_exact_top_k_from_fewer_candidates():
    vectors, mask = clustered()
    codec = fit_codec(jnp.asarray(vectors[mask]), jax.random.key(0), num_centroids=9, bits=4)
    index = build_index(codec, vectors, mask)
    assert sorted(np.asarray(index.holders))[-1] == len(vectors)  # the BOS centroid
    rng = np.random.default_rng(1)
    q = unit(vectors[[1, 8, 20], :5] + 0.05 * rng.normal(size=(3, 5, 16)))
    q_mask = np.ones((3, 5), bool)
    stored = decompress(codec, index.codes, index.residuals)
    exact = np.asarray(maxsim_scores(q, q_mask, stored, mask))
    scores, ids, candidates = search(index, q, q_mask, k=3, nprobe=1, max_candidates=12)
    np.testing.assert_array_equal(ids, np.argsort(-exact, axis=1)[:, :3])
    np.testing.assert_allclose(scores, np.sort(exact, axis=1)[:, ::-1][:, :3], rtol=1e-5)
    assert np.all(np.asarray(candidates) < len(vectors))
    for share, nprobe in ((1.0, 1), (0.5, 9)):  # the BOS centroid counted, or every centroid
        everything = search(
            index, q, q_mask, k=3, nprobe=nprobe, max_candidates=len(vectors), max_share=share
        )
        np.testing.assert_array_equal(everything[1], ids)
        assert np.all(np.asarray(everything[2]) == len(vectors))

    retriever = LateInteractionRetriever(
        index,
        [f"p{i}" for i in range(len(vectors))],
        lambda texts: (q[:1], q_mask[:1]),
        nprobe=1,
        max_candidates=12,
    )
    hits = retriever.search("any query", 2)
    assert [h.id for h in hits] == [f"p{i}" for i in ids[0, :2]]
    assert [h.rank for h in hits] == [1, 2]
