"""Mapping logical array axes onto device meshes.

Build a mesh with :func:`make_mesh`, pick a rule table (:data:`DEFAULT_RULES` or the gin-configured
:func:`axis_rules`), lay parameters out with :func:`logical_to_sharding` / :func:`shard_params`, and
run model code inside ``with activate(mesh, rules):`` (``jax.set_mesh`` + :func:`use_rules`) so
that :func:`with_logical_constraint` shards activations; outside any mesh it does nothing.
:func:`ring_attention` is sequence-parallel attention, :func:`pipeline_loss` runs a loss's layers
as pipeline stages (GPipe or 1F1B, :func:`make_schedule`), :func:`array_layouts` /
:func:`insufficiently_sharded` inspect a layout and :func:`plan_memory` sizes a run (full or
adapter fine-tuning, QLoRA's NF4 base), :func:`plan_rlhf` RLHF's four models.
"""

from sharding.constraints import activate, with_logical_constraint
from sharding.diagnostics import ArrayLayout, array_layouts, format_layouts, insufficiently_sharded
from sharding.memory_plan import (
    LLAMA3_8B,
    LLAMA3_70B,
    PRESETS,
    Adapters,
    MemoryPlan,
    ModelShape,
    RLHFPlan,
    memory_report,
    plan_memory,
    plan_rlhf,
)
from sharding.mesh import MESH_AXES, MeshSpec, active_axis_size, axis_sizes, make_mesh
from sharding.partition import is_logical_axes, logical_to_sharding, logical_to_specs, shard_params
from sharding.pipeline import Schedule, bubble_fraction, make_schedule, pipeline_loss
from sharding.ring_attention import ring_attention
from sharding.rules import (
    DEFAULT_RULES,
    DEFAULT_TABLE,
    AxisRules,
    ShardingError,
    axis_rules,
    current_rules,
    logical_to_spec,
    use_rules,
)

__all__ = [
    "DEFAULT_RULES",
    "DEFAULT_TABLE",
    "LLAMA3_8B",
    "LLAMA3_70B",
    "MESH_AXES",
    "PRESETS",
    "Adapters",
    "ArrayLayout",
    "AxisRules",
    "MemoryPlan",
    "MeshSpec",
    "ModelShape",
    "RLHFPlan",
    "Schedule",
    "ShardingError",
    "activate",
    "active_axis_size",
    "array_layouts",
    "axis_rules",
    "axis_sizes",
    "bubble_fraction",
    "current_rules",
    "format_layouts",
    "insufficiently_sharded",
    "is_logical_axes",
    "logical_to_sharding",
    "logical_to_spec",
    "logical_to_specs",
    "make_mesh",
    "make_schedule",
    "memory_report",
    "pipeline_loss",
    "plan_memory",
    "plan_rlhf",
    "ring_attention",
    "shard_params",
    "use_rules",
    "with_logical_constraint",
]
