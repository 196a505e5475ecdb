"""Mesh construction: axis sizes, order, gin, and the multi-slice split."""

import types

import gin
import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from sharding import MESH_AXES, MeshSpec, make_mesh
from sharding.mesh import dcn_split, hybrid_device_array, num_slices


def test_make_mesh_fills_rest_and_missing_axes():
    mesh = make_mesh({"tensor": 4, "data": -1})
    assert mesh.axis_names == MESH_AXES and mesh.axis_names[-1] == "tensor"
    assert dict(mesh.shape) == {
        "data": 2,
        "stage": 1,
        "fsdp": 1,
        "expert": 1,
        "sequence": 1,
        "tensor": 4,
    }
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    # tensor innermost: its groups are the devices adjacent in the device array.
    assert [d.id for d in mesh.devices.reshape(2, 4)[0]] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "spec",
    [[("fsdp", 2), ("sequence", 4)], {"sequence": 4, "fsdp": -1}, MeshSpec(fsdp=2, sequence=4)],
)
def test_spec_forms_agree(spec):
    assert dict(make_mesh(spec).shape)["sequence"] == 4
    assert dict(make_mesh(spec).shape)["fsdp"] == 2


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"data": -1, "fsdp": -1}, "at most one -1"),
        ({"data": 3}, "needs 3 devices"),
        ({"pipeline": 2}, "unknown mesh axes"),
        ({"data": 3, "fsdp": -1}, "do not divide"),
    ],
)
def test_bad_specs_raise(spec, message):
    with pytest.raises(ValueError, match=message):
        make_mesh(spec)


def test_gin_configures_mesh():
    gin.parse_config('sharding.make_mesh.spec = {"fsdp": 2, "tensor": -1}')
    try:
        assert dict(make_mesh().shape)["tensor"] == 4
    finally:
        gin.clear_config()
    assert dict(make_mesh().shape)["fsdp"] == jax.device_count()


def test_dcn_split_puts_slices_on_outer_axes():
    sizes = {"data": 1, "fsdp": 16, "expert": 1, "sequence": 1, "tensor": 4}
    ici, dcn = dcn_split(sizes, 4)
    assert dcn["fsdp"] == 4 and ici["fsdp"] == 4 and ici["tensor"] == 4
    with pytest.raises(ValueError, match="slices must divide"):
        dcn_split({**sizes, "fsdp": 2}, 4)


def test_hybrid_device_array_keeps_slices_contiguous():
    fake = [
        types.SimpleNamespace(
            id=i,
            slice_index=i // 4,
            process_index=0,
            platform="cpu",
            device_kind="cpu",
            coords=None,
        )
        for i in range(8)
    ]
    assert num_slices(fake) == 2 and num_slices(jax.devices()) == 1
    sizes = {"data": 1, "fsdp": 4, "expert": 1, "sequence": 1, "tensor": 2}
    array = hybrid_device_array(sizes, fake)
    assert array.shape == (1, 1, 4, 1, 1, 2)  # MESH_AXES order: data, stage, fsdp, ...
    slice_of = np.vectorize(lambda d: d.slice_index)(array)
    assert (slice_of[:, :, :2] == 0).all() and (slice_of[:, :, 2:] == 1).all()
