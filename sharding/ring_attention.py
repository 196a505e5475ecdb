"""Ring attention: sequence-parallel exact attention for contexts longer than one device holds.

Queries, keys and values are split along the sequence over a mesh axis (``sequence``).  Each device
keeps its query block and passes its K/V block around the ring with ``ppermute``; after ``n - 1``
hops every query block has met every K/V block, and partial results are merged with the online
softmax (running max ``m``, normaliser ``l``, unnormalised output ``acc``) as in flash attention, so
no device ever materialises more than one ``[T/n, S/n]`` block of logits.  Batch and heads stay
sharded by the rules (heads on ``tensor``), so this composes with tensor parallelism.  Gradients
come from autodiff through ``shard_map`` (``ppermute`` transposes to the reverse ring); the ring
step is rematerialised so only the carried K/V blocks and softmax state are kept per hop.
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


def _block_state(qg, k, v, k_seg, q_pos, q_seg, src, *, causal, sliding_window, cap, scale):
    """Softmax state of the query block against the K/V block that started on device ``src``."""
    sc = k.shape[1]
    k_pos = src * sc + jnp.arange(sc)
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


def _ring_body(
    q, k, v, q_seg, k_seg, *, axis_name, ring, offset, causal, sliding_window, cap, scale
):
    b, tc, n, h = q.shape
    kh = k.shape[2]
    idx = jax.lax.axis_index(axis_name)
    q_pos = idx * tc + offset + jnp.arange(tc)
    qg = q.reshape(b, tc, kh, n // kh, h)
    block = functools.partial(
        _block_state,
        qg,
        q_pos=q_pos,
        q_seg=q_seg,
        causal=causal,
        sliding_window=sliding_window,
        cap=cap,
        scale=scale,
    )
    perm = [(i, (i + 1) % ring) for i in range(ring)]

    @jax.checkpoint
    def hop(carry, step):
        k, v, k_seg, state = carry
        k, v, k_seg = (jax.lax.ppermute(x, axis_name, perm) for x in (k, v, k_seg))
        src = (idx - step) % ring
        state = _merge(state, block(k, v, k_seg, src=src))
        return (k, v, k_seg, state), None

    state = block(k, v, k_seg, src=idx)
    (_, _, _, (_, l, acc)), _ = jax.lax.scan(hop, (k, v, k_seg, state), jnp.arange(1, ring))
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
    mesh=None,
    rules: AxisRules | None = None,
):
    """Exact attention with q ``[B,T,N,H]`` and k/v ``[B,S,K,H]`` split along T and S over ``axis_name``.

    Same semantics as ``pallas_kernels.reference_attention`` (queries are the last T of S
    positions; GQA; ``segment_ids=(q_seg [B,T], kv_seg [B,S])``; sliding window; soft cap; fully
    masked rows give zeros).  ``mesh`` defaults to the active one (``jax.set_mesh`` /
    ``sharding.activate``); batch and heads are sharded by ``rules`` (default: the active rules).
    T and S must divide by the ring size.
    """
    b, t, s, _n, _kh, h = check_attention_inputs(
        q, k, v, segment_ids, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap
    )
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError(
                "ring_attention needs a mesh: pass mesh= or call it under jax.set_mesh"
            )
    sizes = axis_sizes(mesh)
    ring = sizes[axis_name]
    if t % ring or s % ring:
        raise ValueError(f"query length {t} and key length {s} must divide by {axis_name}={ring}")
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
        causal=causal,
        sliding_window=sliding_window,
        cap=logits_soft_cap,
        scale=h**-0.5 if sm_scale is None else sm_scale,
    )
    return jax.shard_map(
        body, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec, seg_spec), out_specs=q_spec
    )(q, k, v, *segment_ids)
