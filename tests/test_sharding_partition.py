"""Axes trees to shardings, parameter placement, and activation constraints."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from sharding import (
    DEFAULT_RULES,
    ShardingError,
    activate,
    logical_to_sharding,
    make_mesh,
    shard_params,
    with_logical_constraint,
)

AXES = {
    "embed": ("vocab", "embed"),
    "layers": [{"w": ("layers", "embed", "mlp")}, {"norm": ("layers", "norm")}],
    "scalar": (),
}
SHAPES = {
    "embed": jnp.zeros((16, 8)),
    "layers": [{"w": jnp.zeros((2, 8, 12))}, {"norm": jnp.zeros((2, 8))}],
    "scalar": jnp.zeros(()),
}


@pytest.fixture(scope="module")
def mesh():
    return make_mesh({"fsdp": 2, "tensor": 4})


def test_nested_tree_to_named_shardings(mesh):
    shardings = logical_to_sharding(AXES, mesh, DEFAULT_RULES, shapes=SHAPES)
    assert jax.tree.structure(shardings) == jax.tree.structure(SHAPES)
    assert all(isinstance(s, NamedSharding) and s.mesh == mesh for s in jax.tree.leaves(shardings))
    assert shardings["embed"].spec == P("tensor", "fsdp")
    assert shardings["layers"][0]["w"].spec == P(None, "fsdp", "tensor")
    assert shardings["layers"][1]["norm"].spec == P(None, None)
    assert shardings["scalar"].spec == P()


def test_divisibility_error_names_parameter_path(mesh):
    bad = {**SHAPES, "layers": [{"w": jnp.zeros((2, 8, 6))}, {"norm": jnp.zeros((2, 8))}]}
    with pytest.raises(
        ShardingError, match=r"layers/0/w: dimension 2 \('mlp'\).*size 6.*total size 4"
    ):
        logical_to_sharding(AXES, mesh, DEFAULT_RULES, shapes=bad)


def test_shard_params_places_shards(mesh):
    params = jax.tree.map(lambda x: jnp.arange(x.size, dtype=jnp.float32).reshape(x.shape), SHAPES)
    placed = shard_params(params, AXES, mesh, DEFAULT_RULES)
    w = placed["layers"][0]["w"]
    assert w.sharding.spec == P(None, "fsdp", "tensor")
    assert {s.data.shape for s in w.addressable_shards} == {(2, 4, 3)}
    np.testing.assert_array_equal(np.asarray(w), np.asarray(params["layers"][0]["w"]))


BTF = ("activation_batch", "activation_length", "activation_mlp")


def test_constraint_is_noop_without_mesh():
    x = jnp.ones((4, 6, 10))  # 10 would not divide any tensor axis: proves no rule is consulted
    assert with_logical_constraint(x, BTF) is x
    hlo = jax.jit(lambda x: with_logical_constraint(x, BTF) * 2).lower(x).as_text()
    assert "sharding" not in hlo.lower()


def test_constraint_shards_under_active_mesh(mesh):
    x = jnp.ones((4, 6, 8))
    with activate(mesh):
        y = jax.jit(lambda x: with_logical_constraint(x * 2, BTF))(x)
        with pytest.raises(ShardingError, match="size 10"):
            jax.jit(lambda x: with_logical_constraint(x, BTF))(jnp.ones((4, 6, 10)))
    assert y.sharding.spec == P("fsdp", None, "tensor")
    assert {s.data.shape for s in y.addressable_shards} == {(2, 6, 2)}


def test_constraint_uses_active_rules_and_skips_manual_axes(mesh):
    x = jnp.ones((4, 6, 8))
    with activate(
        mesh,
        [("activation_batch", "tensor"), ("activation_length", None), ("activation_mlp", "fsdp")],
    ):
        y = jax.jit(lambda x: with_logical_constraint(x, BTF))(x)

        def body(block):  # fsdp is manual here, so only tensor may be named
            return with_logical_constraint(block * 2, BTF)

        z = jax.jit(
            jax.shard_map(
                body,
                in_specs=P(None, None, "fsdp"),
                out_specs=P(None, None, "fsdp"),
                axis_names={"fsdp"},
            )
        )(x)
    assert y.sharding.spec == P("tensor", None, "fsdp")
    np.testing.assert_array_equal(np.asarray(z), 2 * np.asarray(x))


def test_constraint_eager_and_on_explicit_axes():
    x = jnp.ones((4, 6, 8))
    with activate(make_mesh({"fsdp": 2, "tensor": 4})):
        assert with_logical_constraint(x, BTF).sharding.spec == P("fsdp", None, "tensor")
    explicit = make_mesh({"fsdp": 2, "tensor": 4}, axis_type=AxisType.Explicit)
    with activate(explicit):
        y = jax.jit(lambda x: with_logical_constraint(x * 2, BTF))(x)
    assert y.sharding.spec == P("fsdp", None, "tensor")
    np.testing.assert_array_equal(np.asarray(y), 2 * np.asarray(x))
