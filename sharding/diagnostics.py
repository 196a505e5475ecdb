"""Where every parameter lives: per-device shapes and bytes, and the ones left unsharded.

The same rows feed the memory planner, so a planned layout and a real one are computed alike.
``mesh`` may be a real Mesh or just ``{axis: size}``, so layouts for meshes larger than the
machine (e.g. 256 devices) can be inspected from a laptop.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np
from jax.sharding import PartitionSpec

from sharding.mesh import axis_sizes
from sharding.partition import is_logical_axes, path_str
from sharding.rules import AxisRules, current_rules


@dataclasses.dataclass(frozen=True)
class ArrayLayout:
    path: str
    logical_axes: tuple
    spec: PartitionSpec
    shape: tuple[int, ...]
    device_shape: tuple[int, ...]
    itemsize: int

    @property
    def device_elements(self) -> int:
        return math.prod(self.device_shape)

    @property
    def device_bytes(self) -> int:
        return self.device_elements * self.itemsize

    @property
    def total_bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize

    @property
    def replicated(self) -> bool:
        return all(part is None for part in self.spec)


def array_layouts(axes_tree, shapes, mesh, rules: AxisRules | None = None) -> list[ArrayLayout]:
    """One row per array (``shapes``: arrays or ``ShapeDtypeStruct`` matching ``axes_tree``)."""
    rules = AxisRules(current_rules() if rules is None else rules)
    sizes = axis_sizes(mesh)

    def row(path, axes, x):
        name = path_str(path)
        spec = rules.resolve(axes, sizes, shape=x.shape, path=name)
        parts = [
            1 if p is None else math.prod(sizes[a] for a in ((p,) if isinstance(p, str) else p))
            for p in spec
        ]
        device_shape = tuple(d // n for d, n in zip(x.shape, parts))
        return ArrayLayout(
            name, tuple(axes), spec, tuple(x.shape), device_shape, np.dtype(x.dtype).itemsize
        )

    rows = jax.tree_util.tree_map_with_path(row, axes_tree, shapes, is_leaf=is_logical_axes)
    return jax.tree.leaves(rows, is_leaf=lambda x: isinstance(x, ArrayLayout))


def insufficiently_sharded(layouts, mesh, min_bytes: int = 1 << 20) -> list[ArrayLayout]:
    """Parameters of at least ``min_bytes`` that every device holds whole on a multi-device mesh.

    Small ones (norms, biases) are cheap to replicate; a large replicated matrix usually means a
    rule is missing or resolved to size-1 axes only.
    """
    if math.prod(axis_sizes(mesh).values()) == 1:
        return []
    return [row for row in layouts if row.replicated and row.total_bytes >= min_bytes]


def _spec_str(spec: PartitionSpec) -> str:
    return (
        "("
        + ", ".join("-" if p is None else p if isinstance(p, str) else "x".join(p) for p in spec)
        + ")"
    )


def format_layouts(layouts) -> str:
    """A fixed-width table: path, logical axes, mesh axes, global and per-device shape, bytes."""
    header = (
        "parameter",
        "logical axes",
        "mesh axes",
        "shape",
        "per-device shape",
        "per-device bytes",
    )
    body = [
        (
            r.path,
            "(" + ", ".join(str(a) for a in r.logical_axes) + ")",
            _spec_str(r.spec),
            str(r.shape),
            str(r.device_shape),
            f"{r.device_bytes:,}",
        )
        for r in layouts
    ]
    body.append(("total", "", "", "", "", f"{sum(r.device_bytes for r in layouts):,}"))
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i < 5 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths))
        )
        for row in [header, *body]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)
