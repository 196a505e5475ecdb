"""From trees of logical axes to trees of ``NamedSharding`` (and sharded parameters).

A parameter tree's companion "axes tree" has the same structure with a tuple of logical names
in place of each array.  Tuples are pytree nodes, so every traversal here passes ``is_leaf``.
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding

from sharding.rules import AxisRules, current_rules


def is_logical_axes(x) -> bool:
    """True for a tuple of logical names (str or None): a leaf of an axes tree."""
    return isinstance(x, tuple) and all(a is None or isinstance(a, str) for a in x)


def path_str(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator="/")


def logical_to_specs(axes_tree, mesh, rules: AxisRules | None = None, *, shapes=None):
    """Pytree of ``PartitionSpec``; ``mesh`` may be a Mesh or just ``{axis: size}`` (for planning).

    With ``shapes`` (a tree of arrays / ``ShapeDtypeStruct`` with the axes tree's structure) every
    dimension is checked for divisibility, errors naming the parameter path.
    """
    rules = current_rules() if rules is None else AxisRules(rules)

    def spec(path, axes, x=None):
        return rules.resolve(axes, mesh, shape=None if x is None else x.shape, path=path_str(path))

    trees = (axes_tree,) if shapes is None else (axes_tree, shapes)
    return jax.tree_util.tree_map_with_path(spec, *trees, is_leaf=is_logical_axes)


def logical_to_sharding(axes_tree, mesh: Mesh, rules: AxisRules | None = None, *, shapes=None):
    """Pytree of ``NamedSharding`` for ``axes_tree`` on ``mesh`` (see :func:`logical_to_specs`)."""
    specs = logical_to_specs(axes_tree, mesh, rules, shapes=shapes)
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, spec),
        specs,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )


def shard_params(params, axes_tree, mesh: Mesh, rules: AxisRules | None = None):
    """Places ``params`` on ``mesh`` laid out by their logical axes (``jax.device_put``)."""
    return jax.device_put(params, logical_to_sharding(axes_tree, mesh, rules, shapes=params))
