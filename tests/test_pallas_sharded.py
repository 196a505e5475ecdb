"""The shard_map wrapper runs the kernel per (batch, head) shard on 8 fake CPU devices."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from pallas_kernels import BlockSizes, reference_attention, sharded_flash_attention
from pallas_kernels.backend import INTERPRET_COMPILER_OPTIONS

BLOCKS = BlockSizes(8, 8, 8, 8)


def _qkv(kv_heads, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((4, 16, 4, 8))
    k, v = rng.standard_normal((2, 4, 16, kv_heads, 8))
    return tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v))


def _mesh(axis_type):
    return jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(axis_type,) * 3)


def _grads(fn, q, k, v):
    def loss(q, k, v):
        return jnp.sum(jnp.sin(fn(q, k, v)))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)), compiler_options=INTERPRET_COMPILER_OPTIONS)(
        q, k, v
    )


def test_sharded_forward_and_gradients_equal_reference():
    mesh = _mesh(jax.sharding.AxisType.Auto)
    q, k, v = _qkv(kv_heads=2)
    ids = jnp.asarray(np.repeat([[0, 1]], 8, axis=1).repeat(4, axis=0))
    segs = (ids, ids)
    heads = NamedSharding(mesh, P(("data", "fsdp"), None, "tensor"))
    q, k, v = (jax.device_put(x, heads) for x in (q, k, v))

    def flash(q, k, v):
        return sharded_flash_attention(
            q,
            k,
            v,
            segment_ids=segs,
            mesh=mesh,
            block_sizes=BLOCKS,
            interpret=True,
            sliding_window=5,
        )

    def ref(q, k, v):
        return reference_attention(q, k, v, segment_ids=segs, sliding_window=5)

    out = jax.jit(flash, compiler_options=INTERPRET_COMPILER_OPTIONS)(q, k, v)
    assert out.sharding.is_equivalent_to(heads, 4)
    np.testing.assert_allclose(out, ref(q, k, v), atol=2e-5)
    for got, want in zip(_grads(flash, q, k, v), _grads(ref, q, k, v)):
        np.testing.assert_allclose(got, want, atol=2e-5)


def test_mqa_kv_heads_are_repeated_to_the_tensor_axis_under_set_mesh():
    q, k, v = _qkv(kv_heads=1, seed=1)
    with jax.set_mesh(_mesh(jax.sharding.AxisType.Explicit)):
        out = jax.jit(
            lambda q, k, v: sharded_flash_attention(q, k, v, block_sizes=BLOCKS, interpret=True),
            compiler_options=INTERPRET_COMPILER_OPTIONS,
        )(q, k, v)
        assert out.sharding.spec == P(("data", "fsdp"), None, "tensor", None)
    np.testing.assert_allclose(out, reference_attention(q, k, v), atol=2e-5)


def test_indivisible_batch_and_missing_mesh_raise():
    q, k, v = _qkv(kv_heads=2)
    with pytest.raises(ValueError, match="needs a mesh"):
        sharded_flash_attention(q, k, v, interpret=True)
    with pytest.raises(ValueError, match="batch 3"):
        sharded_flash_attention(
            q[:3], k[:3], v[:3], mesh=_mesh(jax.sharding.AxisType.Auto), interpret=True
        )
