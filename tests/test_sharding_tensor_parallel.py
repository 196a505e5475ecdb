"""Megatron layout through the default rules: one forward reduction per sub-layer."""

import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding

from pallas_kernels import reference_attention
from sharding import (
    activate,
    logical_to_sharding,
    logical_to_spec,
    make_mesh,
    with_logical_constraint,
)

B, T, D, F, N, K, H = 8, 16, 64, 256, 8, 4, 16
BTD = ("activation_batch", "activation_length", "activation_embed")
REDUCTIONS = re.compile(r"\b(all-reduce|reduce-scatter)(?:-start)?\(")


def mlp(p, x):
    h = jax.nn.gelu(jnp.einsum("btd,df->btf", with_logical_constraint(x, BTD), p["up"]))
    h = with_logical_constraint(h, ("activation_batch", "activation_length", "activation_mlp"))
    return with_logical_constraint(jnp.einsum("btf,fd->btd", h, p["down"]), BTD)


def attention(p, x):
    x = with_logical_constraint(x, BTD)
    heads = ("activation_batch", "activation_length", "activation_heads", "head_dim")
    kv_heads = ("activation_batch", "activation_length", "activation_kv_heads", "head_dim")
    q = with_logical_constraint(jnp.einsum("btd,dnh->btnh", x, p["q"]), heads)
    k = with_logical_constraint(jnp.einsum("btd,dkh->btkh", x, p["k"]), kv_heads)
    v = with_logical_constraint(jnp.einsum("btd,dkh->btkh", x, p["v"]), kv_heads)
    o = with_logical_constraint(reference_attention(q, k, v), heads)
    return with_logical_constraint(jnp.einsum("btnh,nhd->btd", o, p["o"]), BTD)


SUBLAYERS = {
    "mlp": (mlp, {"up": (("embed", "mlp"), (D, F)), "down": (("mlp", "embed"), (F, D))}),
    "attention": (
        attention,
        {
            "q": (("embed", "q_heads", "head_dim"), (D, N, H)),
            "k": (("embed", "kv_heads", "head_dim"), (D, K, H)),
            "v": (("embed", "kv_heads", "head_dim"), (D, K, H)),
            "o": (("q_heads", "head_dim", "embed"), (N, H, D)),
        },
    ),
}


def compiled_hlo(fn, table, mesh):
    axes = {k: a for k, (a, _) in table.items()}
    shapes = {k: jax.ShapeDtypeStruct(s, jnp.float32) for k, (_, s) in table.items()}
    shardings = logical_to_sharding(axes, mesh, shapes=shapes)
    params = {
        k: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=shardings[k]) for k, s in shapes.items()
    }
    x = jax.ShapeDtypeStruct(
        (B, T, D), jnp.float32, sharding=NamedSharding(mesh, logical_to_spec(BTD, mesh=mesh))
    )
    return jax.jit(fn).lower(params, x).compile().as_text()


@pytest.mark.parametrize("name", SUBLAYERS)
@pytest.mark.parametrize("depth", [1, 2])
def test_one_reduction_per_sublayer_forward(name, depth):
    fn, table = SUBLAYERS[name]
    mesh = make_mesh({"fsdp": 2, "tensor": 4})

    def stack(p, x):
        for _ in range(depth):
            x = fn(p, x)
        return x

    with activate(mesh):
        hlo = compiled_hlo(stack, table, mesh)
    reductions = [line for line in hlo.splitlines() if REDUCTIONS.search(line)]
    assert len(reductions) == depth, reductions
    # Each reduction runs over the 4 tensor-parallel devices (tensor is innermost: [2,4]<=[8]).
    assert all("replica_groups=[2,4]<=[8]" in line or "{0,1,2,3}" in line for line in reductions), (
        reductions
    )
