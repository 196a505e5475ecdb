"""Expert parallelism: experts sharded over the ``expert`` mesh axis, tokens exchanged by
all-to-all in ``shard_map``, equal to the single-device layer in value and gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentic_jax.models import TransformerConfig, init_params, moe
from sharding import activate, make_mesh

CFG = TransformerConfig(
    vocab_size=32, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, head_dim=8, d_ff=16,
    n_experts=8, experts_per_token=2, n_shared_experts=1,
)  # fmt: skip
MESHES = {
    "expert8": {"expert": 8},
    "data2_expert2_fsdp2": {"data": 2, "expert": 2, "fsdp": 2},
    "expert4_tensor2": {"expert": 4, "tensor": 2},
}


@pytest.fixture(scope="module")
def layer():
    p = jax.tree.map(lambda a: a[0], init_params(CFG, jax.random.key(0))["layers"]["moe"])
    p["router"] = p["router"] * 50  # varied routing
    x = jax.random.normal(jax.random.key(1), (8, 4, 16))
    return p, x


def _loss(p, x):
    y, stats = moe.moe_mlp(p, x, CFG)
    return jnp.sum(y**2), (y, stats["dropped"])


_grad = jax.jit(jax.value_and_grad(_loss, has_aux=True))


@pytest.mark.parametrize("mesh_name", MESHES)
def test_expert_parallel_equals_single_device(layer, mesh_name):
    p, x = layer
    (want_loss, (want, _)), want_grads = _grad(p, x)
    with activate(make_mesh(MESHES[mesh_name])):
        (loss, (y, dropped)), grads = jax.jit(jax.value_and_grad(_loss, has_aux=True))(p, x)
    assert int(dropped) == 0
    np.testing.assert_allclose(y, want, atol=1e-5)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_the_compiled_layer_exchanges_tokens_by_all_to_all(layer):
    p, x = layer
    with activate(make_mesh({"expert": 4, "data": 2})):
        hlo = jax.jit(lambda p, x: moe.moe_mlp(p, x, CFG)[0]).lower(p, x).compile().as_text()
    assert "all-to-all" in hlo
    with activate(make_mesh({"data": 8})):
        hlo = jax.jit(lambda p, x: moe.moe_mlp(p, x, CFG)[0]).lower(p, x).compile().as_text()
    assert "all-to-all" not in hlo  # without an expert axis every device keeps its tokens
