"""Sharding activations by logical name from inside model code.

Model functions call ``with_logical_constraint(x, ("activation_batch", ...))`` unconditionally.  It
reads the mesh that is active while tracing (``jax.set_mesh``) and the active rule table
(``use_rules``, else the gin-configured default), so the same code runs single-device (no mesh:
the call returns ``x`` untouched) and sharded.  Rules are read at trace time: changing them
without changing the mesh does not retrace an already-compiled ``jit`` function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import jax
from jax.sharding import AxisType, Mesh

from sharding.rules import AxisRules, current_rules, use_rules


@contextlib.contextmanager
def activate(mesh: Mesh, rules: AxisRules | None = None):
    """``jax.set_mesh(mesh)`` plus ``use_rules(rules)`` (the current rules when None) in one block.

    Use it around both tracing (``jit`` calls) and eager sharded code::

        with sharding.activate(mesh, rules):
            loss = train_step(params, batch)
    """
    with jax.set_mesh(mesh), use_rules(current_rules() if rules is None else rules):
        yield mesh


def _unmanual_sizes(mesh) -> dict[str, int]:
    """Axis sizes with manual (``shard_map``) axes as 1, so no constraint names them."""
    return {
        name: 1 if kind == AxisType.Manual else size
        for (name, size), kind in zip(mesh.shape.items(), mesh.axis_types)
    }


def with_logical_constraint(x, logical_axes: Sequence[str | None], rules: AxisRules | None = None):
    """Constrains ``x``'s sharding by logical axis names; returns ``x`` unchanged when no mesh is active.

    On ``Auto`` axes this is ``with_sharding_constraint`` (a hint the partitioner propagates); on
    ``Explicit`` axes, where a constraint would only assert, it is ``reshard``.  Inside
    ``shard_map`` the manual axes are left out.  Raises ``ShardingError`` when a dimension does not
    divide its mesh axes (silent padding would waste memory and compute).
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    rules = current_rules() if rules is None else rules
    spec = AxisRules(rules).resolve(logical_axes, _unmanual_sizes(mesh), shape=x.shape)
    if AxisType.Explicit in mesh.axis_types:
        return jax.sharding.reshard(x, spec)
    if isinstance(x, jax.core.Tracer):
        return jax.lax.with_sharding_constraint(x, spec)
    # Eagerly, an uncommitted single-device array cannot meet a spec on the abstract mesh directly.
    return _constrain(x, spec)


_constrain = jax.jit(jax.lax.with_sharding_constraint, static_argnums=1)
