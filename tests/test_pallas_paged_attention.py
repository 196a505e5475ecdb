"""Paged decode attention (interpret mode) against contiguous attention on the same keys."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pallas_kernels import paged_attention, paged_attention_reference, reference_attention
from pallas_kernels.backend import INTERPRET_COMPILER_OPTIONS


@st.composite
def paged_caches(draw):
    """Contiguous per-sequence K/V scattered into pages through a random permutation.

    The last sequence is always empty (a free slot of a continuously batched engine)."""
    b = draw(st.sampled_from([3, 2]))
    kv_heads, groups = draw(st.sampled_from([2, 1])), draw(st.sampled_from([2, 1]))
    page_size, max_pages, h = draw(st.sampled_from([8, 16])), draw(st.integers(2, 4)), 8
    capacity = page_size * max_pages
    lengths = [capacity - draw(st.integers(0, capacity - 1)) for _ in range(b - 1)] + [0]
    num_pages = b * max_pages + draw(st.integers(0, 3))  # some pages belong to no one
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([jnp.float32, jnp.bfloat16]))
    q = rng.standard_normal((b, kv_heads * groups, h))
    k, v = rng.standard_normal((2, b, max_pages * page_size, kv_heads, h))
    table = rng.permutation(num_pages)[: b * max_pages].reshape(b, max_pages)
    k_pages, v_pages = rng.standard_normal((2, num_pages, page_size, kv_heads, h))
    k_pages[table] = k.reshape(b, max_pages, page_size, kv_heads, h)
    v_pages[table] = v.reshape(b, max_pages, page_size, kv_heads, h)
    options = dict(
        sliding_window=draw(st.one_of(st.none(), st.integers(1, 20))),
        logits_soft_cap=draw(st.sampled_from([None, 3.0])),
    )
    q, k, v, k_pages, v_pages = (jnp.asarray(x, dtype) for x in (q, k, v, k_pages, v_pages))
    return (
        q,
        k,
        v,
        k_pages,
        v_pages,
        jnp.asarray(table, jnp.int32),
        jnp.asarray(lengths, jnp.int32),
        options,
    )


@settings(max_examples=4)
@given(paged_caches())
def test_paged_attention_equals_contiguous_attention(cache):
    q, k, v, k_pages, v_pages, table, lengths, options = cache
    got = jax.jit(
        functools.partial(paged_attention, interpret=True, **options),
        compiler_options=INTERPRET_COMPILER_OPTIONS,
    )(q, k_pages, v_pages, table, lengths)
    gathered = jax.jit(functools.partial(paged_attention_reference, **options))(
        q, k_pages, v_pages, table, lengths
    )
    contiguous = jax.jit(functools.partial(reference_attention, causal=True, **options))
    tol = 1e-5 if q.dtype == jnp.float32 else 1e-2
    assert got.shape == q.shape and got.dtype == q.dtype
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(gathered, np.float32), atol=tol, rtol=tol
    )
    for b, length in enumerate(np.asarray(lengths)):
        if length == 0:
            np.testing.assert_array_equal(np.asarray(got[b], np.float32), 0.0)
            continue
        # The decode token is the last of `length` positions: causal attention of one query.
        want = contiguous(q[b][None, None], k[b, :length][None], v[b, :length][None])[0, 0]
        np.testing.assert_allclose(
            np.asarray(got[b], np.float32), np.asarray(want, np.float32), atol=tol, rtol=tol
        )


def test_paged_attention_rejects_mismatched_tables_and_lengths_past_them():
    q = jnp.zeros((2, 4, 8))
    pages = jnp.zeros((6, 8, 2, 8))
    with pytest.raises(ValueError, match="block_tables"):
        paged_attention(
            q,
            pages,
            pages,
            jnp.zeros((3, 2), jnp.int32),
            jnp.zeros((2,), jnp.int32),
            interpret=True,
        )
    with pytest.raises(ValueError, match="capacity of 16 tokens"):
        paged_attention(
            q,
            pages,
            pages,
            jnp.zeros((2, 2), jnp.int32),
            jnp.array([3, 17], jnp.int32),
            interpret=True,
        )
