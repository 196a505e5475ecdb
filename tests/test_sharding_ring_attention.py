"""Ring attention equals the reference attention in value and gradient, in both layouts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels import reference_attention
from sharding import activate, make_mesh
from sharding.ring_attention import from_zigzag, ring_attention, to_zigzag

CASES = {
    "causal_gqa_query_suffix": dict(t=16, s=32, n=4, kv=2, causal=True),
    "segments_window_cap": dict(
        t=32, s=32, n=4, kv=2, causal=True, segments=True, sliding_window=5, logits_soft_cap=20.0
    ),
    "bidirectional_window": dict(t=32, s=32, n=2, kv=2, causal=False, sliding_window=9),
    "zigzag_segments_window_cap": dict(
        t=32,
        s=32,
        n=4,
        kv=2,
        causal=True,
        segments=True,
        sliding_window=5,
        logits_soft_cap=20.0,
        layout="zigzag",
    ),
    "zigzag_bidirectional": dict(t=32, s=32, n=2, kv=2, causal=False, layout="zigzag"),
}
MESHES = {"seq4_tensor2": {"sequence": 4, "tensor": 2}, "seq8": {"sequence": 8}}


def inputs(t, s, n, kv, segments=False, batch=2, h=8):
    kq, kk, kvv, kw = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(kq, (batch, t, n, h))
    k = jax.random.normal(kk, (batch, s, kv, h))
    v = jax.random.normal(kvv, (batch, s, kv, h))
    w = jax.random.normal(kw, (batch, t, n, h))
    seg = None
    if (
        segments
    ):  # three documents of uneven length, and a padding tail (id 0 never matches queries)
        kv_seg = jnp.broadcast_to(
            jnp.searchsorted(jnp.array([7, 19, 29]), jnp.arange(s), side="right"), (batch, s)
        ).astype(jnp.int32)
        seg = (kv_seg[:, s - t :] + (jnp.arange(t) >= t - 2) * 10, kv_seg)
    return q, k, v, w, seg


@pytest.mark.parametrize(
    "mesh_name, case",
    [("seq4_tensor2", case) for case in CASES]
    + [("seq8", "segments_window_cap"), ("seq8", "zigzag_segments_window_cap")],
)
def test_ring_matches_reference_value_and_grad(mesh_name, case):
    cfg = dict(CASES[case])
    q, k, v, w, seg = inputs(
        cfg.pop("t"), cfg.pop("s"), cfg.pop("n"), cfg.pop("kv"), cfg.pop("segments", False)
    )
    layout = cfg.pop("layout", "contiguous")
    mesh = make_mesh(MESHES[mesh_name])
    ring = mesh.shape["sequence"]

    def ring_in_layout(q, k, v, segment_ids, **kw):
        """The ring on inputs reordered to its layout, the output put back in natural order."""
        if layout == "contiguous":
            return ring_attention(q, k, v, segment_ids=segment_ids, **kw)
        q, k, v = (to_zigzag(x, ring) for x in (q, k, v))
        segment_ids = None if segment_ids is None else [to_zigzag(x, ring) for x in segment_ids]
        out = ring_attention(q, k, v, segment_ids=segment_ids, layout="zigzag", **kw)
        return from_zigzag(out, ring)

    def loss(fn, q, k, v):
        out = fn(q, k, v, segment_ids=seg, **cfg)
        return jnp.sum(out * w), out

    def grad(fn):
        return jax.jit(jax.grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2), has_aux=True))

    with activate(mesh):
        ring_grads, ring_out = grad(ring_in_layout)(q, k, v)
    ref_grads, ref_out = grad(reference_attention)(q, k, v)
    if seg is not None:  # rows with no visible key must be zero, as in the reference
        assert np.all(np.asarray(ring_out)[:, -2:] == 0)
    np.testing.assert_allclose(ring_out, ref_out, atol=2e-5, rtol=2e-5)
    for got, want in zip(ring_grads, ref_grads):
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=5e-5)
    if layout == "contiguous":
        assert ring_out.sharding.spec[1] == "sequence"


def test_zigzag_round_trip_and_device_chunks():
    x = jnp.arange(2 * 16).reshape(2, 16)
    z = to_zigzag(x, ring=4)
    np.testing.assert_array_equal(from_zigzag(z, ring=4), x)
    # Device i of 4 holds chunks i and 7 - i (chunks of 2 positions).
    np.testing.assert_array_equal(z[0].reshape(4, 4)[1], [2, 3, 12, 13])


@pytest.mark.parametrize("ring", [2, 4, 8])
def test_zigzag_balances_causal_work(ring):
    """Visible causal (query, key) pairs per device: equal in zig-zag order, not in contiguous."""
    t = 8 * ring
    pos = np.arange(t)
    causal = pos[:, None] >= pos[None, :]

    def work(order):
        return causal[np.asarray(order)].reshape(ring, -1).sum(1)

    balanced = work(to_zigzag(jnp.arange(t)[None], ring)[0])
    assert len(set(balanced.tolist())) == 1
    assert len(set(work(pos).tolist())) == ring


def test_ring_passes_kv_blocks_instead_of_gathering():
    q, k, v, _, _ = inputs(32, 32, 4, 2)
    with activate(make_mesh({"sequence": 4, "tensor": 2})):
        hlo = jax.jit(ring_attention).lower(q, k, v).compile().as_text()
    assert "collective-permute" in hlo
    assert "all-gather" not in hlo and "all-to-all" not in hlo


def test_ring_rejects_indivisible_lengths():
    q, k, v, _, _ = inputs(30, 30, 2, 2)
    with (
        activate(make_mesh({"sequence": 4, "tensor": 2})),
        pytest.raises(ValueError, match="over sequence=4"),
    ):
        ring_attention(q, k, v)
