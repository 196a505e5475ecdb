"""Device meshes over the six named parallelism axes.

Every mesh built here has all of ``MESH_AXES`` (unused ones with size 1) so that one rule table can
name any of them regardless of the layout chosen for a run.  The axis *order* of the device array
is chosen for the interconnect: the outermost axes change device least often and so span the
slowest links (across slices / hosts), the innermost span the fastest.  ``data`` needs one gradient
all-reduce per step, ``stage`` (pipeline parallelism, :mod:`sharding.pipeline`) one point-to-point
activation send per micro-batch and stage boundary, ``fsdp`` one all-gather per layer, ``expert``
all-to-alls, ``sequence`` a ring of K/V exchanges, and ``tensor`` a reduction per sub-layer on the
critical path, so ``tensor`` goes innermost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import gin
import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

# Physical order, outermost (slowest links) first.  Also the order of ``MeshSpec`` fields.
MESH_AXES = ("data", "stage", "fsdp", "expert", "sequence", "tensor")

# Axes that may be split across slices (data-center network); tried in this order.
_DCN_AXES = ("data", "fsdp")


@dataclasses.dataclass(frozen=True)
class MeshSpec:
    """Sizes of the mesh axes; at most one may be -1, meaning "all remaining devices"."""

    data: int = 1
    stage: int = 1
    fsdp: int = 1
    expert: int = 1
    sequence: int = 1
    tensor: int = 1

    @classmethod
    def from_any(cls, spec) -> MeshSpec:
        """Accepts a MeshSpec or a mapping / sequence of (axis, size) pairs (names, not positions,
        so a spec cannot silently depend on the device order of ``MESH_AXES``)."""
        if isinstance(spec, MeshSpec):
            return spec
        pairs = list(spec.items()) if isinstance(spec, Mapping) else [tuple(p) for p in spec]
        names = [name for name, _ in pairs]
        unknown = sorted(set(names) - set(MESH_AXES))
        if unknown:
            raise ValueError(f"unknown mesh axes {unknown}; the axes are {MESH_AXES}")
        if len(set(names)) != len(names):
            raise ValueError(f"mesh axis given twice in {spec}")
        return cls(**{name: int(size) for name, size in pairs})

    def sizes(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESH_AXES}

    def resolve(self, n_devices: int) -> dict[str, int]:
        """Axis sizes with the -1 axis filled in; checks that they multiply to ``n_devices``."""
        sizes = self.sizes()
        free = [name for name, size in sizes.items() if size == -1]
        bad = {name: size for name, size in sizes.items() if size == 0 or size < -1}
        if bad or len(free) > 1:
            raise ValueError(f"mesh sizes must be positive with at most one -1; got {sizes}")
        fixed = math.prod(size for size in sizes.values() if size != -1)
        if free:
            if n_devices % fixed:
                raise ValueError(f"{n_devices} devices do not divide by the fixed axes {sizes}")
            sizes[free[0]] = n_devices // fixed
        if math.prod(sizes.values()) != n_devices:
            raise ValueError(
                f"mesh {sizes} needs {math.prod(sizes.values())} devices, have {n_devices}"
            )
        return sizes


def num_slices(devices: Sequence) -> int:
    """How many ICI-connected granules the devices form (TPU slices, else hosts)."""
    if any(getattr(d, "slice_index", None) is not None for d in devices):
        return len({d.slice_index for d in devices})
    return len({d.process_index for d in devices})


def dcn_split(sizes: Mapping[str, int], slices: int) -> tuple[dict[str, int], dict[str, int]]:
    """Factors axis sizes into (within-slice, across-slice) parts for a hybrid mesh.

    The slice count goes on the outermost axis it divides (``data``, then ``fsdp``): those
    collectives are the least frequent, so they tolerate the slower data-center network.
    Axes absent from ``sizes`` have size 1.
    """
    sizes = axis_sizes(sizes)
    dcn = dict.fromkeys(MESH_AXES, 1)
    for name in _DCN_AXES:
        if sizes[name] % slices == 0:
            dcn[name] = slices
            break
    else:
        raise ValueError(f"{slices} slices must divide one of {_DCN_AXES} in mesh {dict(sizes)}")
    ici = {name: sizes[name] // dcn[name] for name in MESH_AXES}
    return ici, dcn


@gin.configurable(module="sharding")
def make_mesh(
    spec=(("fsdp", -1),), *, devices: Sequence | None = None, axis_type: AxisType = AxisType.Auto
) -> Mesh:
    """Builds a mesh with all six ``MESH_AXES`` from sizes (see ``MeshSpec.from_any``).

    Axes default to ``Auto`` so the partitioner propagates shardings through ``jit`` and
    ``with_sharding_constraint`` acts as a hint; pass ``AxisType.Explicit`` for sharding-in-types.
    Devices spanning several slices or hosts get a hybrid (ICI x DCN) device order.

    gin: ``sharding.make_mesh.spec = {"fsdp": 2, "tensor": -1}``.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = MeshSpec.from_any(spec).resolve(len(devices))
    shape = [sizes[name] for name in MESH_AXES]
    axis_types = (axis_type,) * len(MESH_AXES)
    if num_slices(devices) == 1:
        return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
    return Mesh(hybrid_device_array(sizes, devices), MESH_AXES, axis_types=axis_types)


def hybrid_device_array(sizes: Mapping[str, int], devices: Sequence) -> np.ndarray:
    """Devices arranged so that each slice (or host) is a contiguous block of the DCN axis."""
    ici, dcn = dcn_split(sizes, num_slices(devices))
    return np.asarray(
        mesh_utils.create_hybrid_device_mesh(
            [ici[name] for name in MESH_AXES],
            [dcn[name] for name in MESH_AXES],
            devices,
            process_is_granule=getattr(devices[0], "slice_index", None) is None,
        )
    )


def active_axis_size(axis_name: str, mesh=None) -> int:
    """Devices on ``axis_name`` of ``mesh`` (default: the active one, read while tracing); 1 with
    no mesh, so model code can ask whether a ring or a pipeline is there at all."""
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            return 1
    return axis_sizes(mesh)[axis_name]


def axis_sizes(mesh) -> dict[str, int]:
    """``{axis: size}`` of a Mesh, AbstractMesh, MeshSpec or mapping (axes absent there are 1)."""
    if isinstance(mesh, MeshSpec):
        sizes = mesh.sizes()
    elif isinstance(mesh, Mapping):
        sizes = dict(mesh)
    else:
        sizes = dict(mesh.shape)
    if any(size < 1 for size in sizes.values()):
        raise ValueError(f"axis sizes must be resolved positive numbers; got {sizes}")
    return {**dict.fromkeys(MESH_AXES, 1), **sizes}
