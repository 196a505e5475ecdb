"""Running the attention kernel per shard under ``jax.shard_map``.

A Pallas call is opaque to XLA's partitioner, so under ``jit`` with sharded inputs it would
be gathered onto every device.  Attention is independent per sequence and per head, so the
kernel can instead run on each device's local block with no communication at all: batch
split over the data-parallel axes (``data``, ``fsdp``), heads over ``tensor``.  When the
kv heads do not split evenly over ``tensor`` (MQA, or K < tensor size) they are repeated
just enough to do so -- each device then holds the kv heads of its own query heads.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels.flash_attention import flash_attention
from pallas_kernels.reference import check_attention_inputs


def sharded_flash_attention(
    q,
    k,
    v,
    *,
    segment_ids=None,
    mesh=None,
    batch_axes=("data", "fsdp"),
    head_axis="tensor",
    **kwargs,
):
    """``flash_attention`` with batch on ``batch_axes`` and heads on ``head_axis``.

    ``mesh`` defaults to the one set by ``jax.set_mesh``; axes it lacks are ignored.  Other
    keyword arguments go to :func:`flash_attention`.  Raises ValueError when B or N does
    not divide by the product of its axes' sizes.
    """
    b, _, _, n, kv_heads, _ = check_attention_inputs(q, k, v, segment_ids)
    mesh = jax.sharding.get_abstract_mesh() if mesh is None else mesh
    if mesh.empty:
        raise ValueError("sharded_flash_attention needs a mesh: pass mesh= or use jax.set_mesh")
    sizes = dict(mesh.shape)
    batch = tuple(a for a in batch_axes if a in sizes)
    head = head_axis if head_axis in sizes else None
    batch_size = math.prod(sizes[a] for a in batch)
    head_size = sizes[head] if head else 1
    if b % batch_size or n % head_size:
        raise ValueError(
            f"batch {b} must divide by {batch}={batch_size} and query heads {n} "
            f"by {head!r}={head_size}"
        )
    if kv_heads % head_size:
        repeat = head_size // math.gcd(kv_heads, head_size)
        k, v = jnp.repeat(k, repeat, axis=2), jnp.repeat(v, repeat, axis=2)
    batch_spec = batch or None
    heads_spec = P(batch_spec, None, head, None)
    seg_spec = None if segment_ids is None else (P(batch_spec, None), P(batch_spec, None))

    def local(q, k, v, segment_ids):
        return flash_attention(q, k, v, segment_ids=segment_ids, **kwargs)

    specs = (heads_spec, heads_spec, heads_spec, seg_spec)
    args = (q, k, v, segment_ids)
    # Explicit axes require inputs already laid out as in_specs (Auto ones are resharded by
    # shard_map itself).
    axis_types = dict(zip(mesh.axis_names, mesh.axis_types))
    used = batch + ((head,) if head else ())
    if used and all(axis_types[a] == AxisType.Explicit for a in used):
        args = jax.tree.map(lambda x, spec: jax.reshard(x, NamedSharding(mesh, spec)), args, specs)
    # check_vma=False: the Pallas call does not declare how its outputs vary over the mesh.
    return jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=heads_spec, check_vma=False)(
        *args
    )
