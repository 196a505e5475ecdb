"""Per-parameter layout table and the insufficient-sharding check."""

import jax
import numpy as np

from agentic_jax.models import TransformerConfig, param_axes, param_shapes
from sharding import DEFAULT_RULES, AxisRules, make_mesh, shard_params
from sharding.diagnostics import array_layouts, format_layouts, insufficiently_sharded

CONFIG = TransformerConfig(tie_embeddings=False, qkv_bias=True)


def test_layouts_match_real_shards():
    mesh = make_mesh({"fsdp": 4, "tensor": 2})
    params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), param_shapes(CONFIG))
    params = shard_params(params, param_axes(CONFIG), mesh)
    rows = {r.path: r for r in array_layouts(param_axes(CONFIG), params, mesh)}
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    assert len(rows) == len(flat)
    for path, x in flat:
        row = rows[jax.tree_util.keystr(path, simple=True, separator="/")]
        assert {s.data.shape for s in x.addressable_shards} == {row.device_shape}
        assert row.spec == x.sharding.spec
    assert rows["layers/mlp/up"].device_bytes == 2 * 16 * 86 * 4


def test_table_lists_every_parameter_and_total():
    rows = array_layouts(param_axes(CONFIG), param_shapes(CONFIG), {"fsdp": 4, "tensor": 2})
    table = format_layouts(rows)
    assert "layers/attn/q  " in table and "(layers, embed, q_heads, head_dim)" in table
    assert "(-, fsdp, tensor, -)" in table and "(2, 16, 2, 16)" in table
    assert table.splitlines()[-1].split()[-1] == f"{sum(r.device_bytes for r in rows):,}"


def test_insufficiently_sharded_flags_large_replicated_params():
    axes, shapes = param_axes(CONFIG), param_shapes(CONFIG)
    mesh = {"fsdp": 8}
    assert (
        insufficiently_sharded(array_layouts(axes, shapes, mesh, DEFAULT_RULES), mesh, 1024) == []
    )
    no_fsdp = AxisRules([("embed", None)]) + DEFAULT_RULES
    flagged = insufficiently_sharded(array_layouts(axes, shapes, mesh, no_fsdp), mesh, 1024)
    assert {r.path for r in flagged} == {
        "embed",
        "lm_head",
        "layers/attn/q",
        "layers/attn/k",
        "layers/attn/v",
        "layers/attn/o",
        "layers/mlp/gate",
        "layers/mlp/up",
        "layers/mlp/down",
    }
    assert insufficiently_sharded(array_layouts(axes, shapes, {}, no_fsdp), {}, 1024) == []
