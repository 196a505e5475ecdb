"""Ring attention: sequence-parallel exact attention for contexts longer than one device holds.

Queries, keys and values are split along the sequence over a mesh axis (``sequence``).  Each device
keeps its query block and passes its K/V block around the ring with ``ppermute``; after ``n - 1``
hops every query block has met every K/V block, and partial results are merged with the online
softmax (running max ``m``, normaliser ``l``, unnormalised output ``acc``) as in flash attention, so
no device ever materialises more than one ``[T/n, S/n]`` block of logits (Liu et al. 2023, "Ring
Attention with Blockwise Transformers for Near-Infinite Context").  Batch and heads stay sharded by
the rules (heads on ``tensor``), so this composes with tensor parallelism.  Gradients come from
autodiff through ``shard_map`` (``ppermute`` transposes to the reverse ring); the ring step is
rematerialised so only the carried K/V blocks and softmax state are kept per hop.

Causal load balance.  With the ``contiguous`` layout (device i holds positions ``[iT/n, (i+1)T/n)``)
a causal mask leaves device 0 one useful block and device n-1 all n, so the ring runs at the pace
of its busiest device.  The ``zigzag`` layout (Llama 3's context parallelism, Dubey et al. 2024;
the same balance Brandon et al. 2023 "Striped Attention" get by striding) cuts the sequence into
``2n`` chunks and gives device i chunks ``i`` and ``2n-1-i``: one early and one late.  Then on
every hop from another device exactly half the block is visible, and it is a whole half, so it is
skipped at no cost: a K/V block from an earlier device is seen by both query chunks through its
first chunk only, one from a later device only by the late query chunk.  Every device does
``1 + (n-1)/2`` blocks of work, against up to ``n`` for the contiguous layout.  Callers hold their
arrays in zig-zag order (:func:`to_zigzag` / :func:`from_zigzag`) for the whole model, not per
call, so the reordering is paid once per forward pass.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from pallas_kernels.masks import MASK_VALUE, visible
from pallas_kernels.reference import check_attention_inputs, soft_cap
from sharding.mesh import axis_sizes
from sharding.rules import AxisRules, current_rules

Q_AXES = ("activation_batch", None, "activation_heads", "head_dim")
KV_AXES = ("activation_batch", None, "activation_kv_heads", "head_dim")
LAYOUTS = ("contiguous", "zigzag")


def to_zigzag(x, ring: int, axis: int = 1):
    """Reorders ``axis`` (length ``2 ring c``) so that its ``ring`` equal shards hold chunks
    ``(i, 2 ring - 1 - i)``: device i of a ``ring``-way split then gets the zig-zag pair."""
    axis = axis % x.ndim
    chunks = x.reshape(*x.shape[:axis], 2, ring, -1, *x.shape[axis + 1 :])
    early = jax.lax.index_in_dim(chunks, 0, axis, keepdims=False)
    late = jnp.flip(jax.lax.index_in_dim(chunks, 1, axis, keepdims=False), axis)
    return jnp.stack([early, late], axis + 1).reshape(x.shape)


def from_zigzag(x, ring: int, axis: int = 1):
    """The inverse of :func:`to_zigzag`: natural order along ``axis``."""
    axis = axis % x.ndim
    pairs = x.reshape(*x.shape[:axis], ring, 2, -1, *x.shape[axis + 1 :])
    early = jax.lax.index_in_dim(pairs, 0, axis + 1, keepdims=False)
    late = jnp.flip(jax.lax.index_in_dim(pairs, 1, axis + 1, keepdims=False), axis)
    return jnp.concatenate([early, late], axis).reshape(x.shape)


def _block_positions(layout: str, device, block: int, ring: int):
    """Global positions of the ``block`` positions that ``device`` holds in ``layout``."""
    if layout == "contiguous":
        return device * block + jnp.arange(block)
    c = block // 2
    early, late = device * c, (2 * ring - 1 - device) * c
    return jnp.concatenate([early + jnp.arange(c), late + jnp.arange(c)])


def _block_state(qg, q_pos, q_seg, k, v, k_pos, k_seg, *, causal, sliding_window, cap, scale):
    """Softmax state ``(m, l, acc)`` of a query block against a K/V block, by global positions."""
    mask = visible(
        q_pos[None, :, None],
        k_pos[None, None, :],
        causal=causal,
        sliding_window=sliding_window,
        q_seg=q_seg[:, :, None],
        k_seg=k_seg[:, None, :],
    )
    mask = mask[:, None, None]  # [B, 1, 1, Tc, Sc] against logits [B, K, G, Tc, Sc]
    logits = jnp.einsum("btkgh,bskh->bkgts", qg, k, preferred_element_type=jnp.float32) * scale
    logits = jnp.where(mask, soft_cap(logits, cap), MASK_VALUE)
    # The result does not depend on the shift m, so it carries no gradient (as in flash attention).
    m = jax.lax.stop_gradient(logits.max(-1))
    p = jnp.where(mask, jnp.exp(logits - m[..., None]), 0.0)
    acc = jnp.einsum("bkgts,bskh->bkgth", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return m, p.sum(-1), acc


def _merge(a, b):
    (m_a, l_a, acc_a), (m_b, l_b, acc_b) = a, b
    m = jnp.maximum(m_a, m_b)
    w_a, w_b = jnp.exp(m_a - m), jnp.exp(m_b - m)
    return m, l_a * w_a + l_b * w_b, acc_a * w_a[..., None] + acc_b * w_b[..., None]


def _zigzag_half(block, qg, q_pos, q_seg, k, v, k_pos, k_seg, *, before: bool):
    """The visible half of a causal zig-zag block from another device (see the module docstring):
    from an earlier device, all queries against the first K/V chunk; from a later one, the late
    query chunk against all keys, with an empty state (m = MASK_VALUE, l = acc = 0) for the early
    chunk, which sees nothing."""
    c = qg.shape[1] // 2
    if before:
        return block(qg, q_pos, q_seg, k[:, :c], v[:, :c], k_pos[:c], k_seg[:, :c])
    m, l, acc = block(qg[:, c:], q_pos[c:], q_seg[:, c:], k, v, k_pos, k_seg)
    return (
        jnp.concatenate([jnp.full_like(m, MASK_VALUE), m], axis=3),
        jnp.concatenate([jnp.zeros_like(l), l], axis=3),
        jnp.concatenate([jnp.zeros_like(acc), acc], axis=3),
    )


def _ring_body(
    q, k, v, q_seg, k_seg, *, axis_name, ring, offset, layout, causal, sliding_window, cap, scale
):
    b, tc, n, h = q.shape
    kh, sc = k.shape[2], k.shape[1]
    idx = jax.lax.axis_index(axis_name)
    q_pos = _block_positions(layout, idx, tc, ring) + offset
    qg = q.reshape(b, tc, kh, n // kh, h)
    block = functools.partial(
        _block_state, causal=causal, sliding_window=sliding_window, cap=cap, scale=scale
    )
    skip_half = causal and layout == "zigzag"
    perm = [(i, (i + 1) % ring) for i in range(ring)]

    def visit(k, v, k_seg, src):
        k_pos = _block_positions(layout, src, sc, ring)
        args = (qg, q_pos, q_seg, k, v, k_pos, k_seg)
        if not skip_half:
            return block(*args)
        return jax.lax.cond(
            src < idx,
            functools.partial(_zigzag_half, block, before=True),
            functools.partial(_zigzag_half, block, before=False),
            *args,
        )

    @jax.checkpoint
    def hop(carry, step):
        k, v, k_seg, state = carry
        k, v, k_seg = (jax.lax.ppermute(x, axis_name, perm) for x in (k, v, k_seg))
        state = _merge(state, visit(k, v, k_seg, (idx - step) % ring))
        return (k, v, k_seg, state), None

    own = block(qg, q_pos, q_seg, k, v, _block_positions(layout, idx, sc, ring), k_seg)
    (_, _, _, (_, l, acc)), _ = jax.lax.scan(hop, (k, v, k_seg, own), jnp.arange(1, ring))
    out = jnp.where(l[..., None] > 0, acc / jnp.where(l > 0, l, 1.0)[..., None], 0.0)
    return out.transpose(0, 3, 1, 2, 4).reshape(b, tc, n, h).astype(q.dtype)


def _with_ring_axis(spec: PartitionSpec, axis_name: str) -> PartitionSpec:
    parts = list(spec)
    parts[1] = axis_name
    return PartitionSpec(*parts)


def ring_attention(
    q,
    k,
    v,
    *,
    causal=True,
    segment_ids=None,
    sliding_window=None,
    logits_soft_cap=None,
    sm_scale=None,
    axis_name: str = "sequence",
    layout: str = "contiguous",
    mesh=None,
    rules: AxisRules | None = None,
):
    """Exact attention with q ``[B,T,N,H]`` and k/v ``[B,S,K,H]`` split along T and S over ``axis_name``.

    Same semantics as ``pallas_kernels.reference_attention`` (queries are the last T of S
    positions; GQA; ``segment_ids=(q_seg [B,T], kv_seg [B,S])``; sliding window; soft cap; fully
    masked rows give zeros).  ``layout`` is the order of positions along T and S of the inputs,
    the segment ids and the output: ``contiguous`` (natural order) or ``zigzag`` (as
    :func:`to_zigzag` leaves them; causal work then balanced over the ring; needs T == S).
    ``mesh`` defaults to the active one (``jax.set_mesh`` / ``sharding.activate``); batch and
    heads are sharded by ``rules`` (default: the active rules).  T and S must divide by the ring
    size (by twice the ring size for ``zigzag``).
    """
    b, t, s, _n, _kh, h = check_attention_inputs(
        q, k, v, segment_ids, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )
    if layout not in LAYOUTS:
        raise ValueError(f"ring_attention layout {layout!r}; expected one of {LAYOUTS}")
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError(
                "ring_attention needs a mesh: pass mesh= or call it under jax.set_mesh"
            )
    sizes = axis_sizes(mesh)
    ring = sizes[axis_name]
    chunks = ring if layout == "contiguous" else 2 * ring
    if t % chunks or s % chunks:
        raise ValueError(
            f"query length {t} and key length {s} must divide by {chunks} ({layout} "
            f"layout over {axis_name}={ring})"
        )
    if layout == "zigzag" and t != s:
        raise ValueError(f"the zigzag layout needs equal query and key lengths; got {t} and {s}")
    rules = AxisRules(current_rules() if rules is None else rules)
    others = {**sizes, axis_name: 1}  # the ring axis belongs to the length dimension here
    q_spec = _with_ring_axis(
        rules.resolve(Q_AXES, others, shape=q.shape, path="ring_attention/q"), axis_name
    )
    kv_spec = _with_ring_axis(
        rules.resolve(KV_AXES, others, shape=k.shape, path="ring_attention/kv"), axis_name
    )
    seg_spec = PartitionSpec(q_spec[0], axis_name)
    if segment_ids is None:
        segment_ids = (jnp.zeros((b, t), jnp.int32), jnp.zeros((b, s), jnp.int32))
    body = functools.partial(
        _ring_body,
        axis_name=axis_name,
        ring=ring,
        offset=s - t,
        layout=layout,
        causal=causal,
        sliding_window=sliding_window,
        cap=logits_soft_cap,
        scale=h**-0.5 if sm_scale is None else sm_scale,
    )
    return jax.shard_map(
        body, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec, seg_spec), out_specs=q_spec
    )(q, k, v, *segment_ids)
