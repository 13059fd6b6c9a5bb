"""Mesh construction and validation: clear MlsysErrors where JAX is silent (docs/jax-notes.md "shard_map and meshes")."""
import jax
import pytest
from jax.sharding import AxisType

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import axis_size, make_mesh, require_axes, validate_divisible


def test_dict_and_tuple_shapes_build_auto_meshes():
    mesh = make_mesh({"data": 2, "tensor": 2, "pipe": 2})
    assert mesh.axis_names == ("data", "tensor", "pipe")
    assert dict(mesh.shape) == {"data": 2, "tensor": 2, "pipe": 2}
    assert all(t == AxisType.Auto for t in mesh.axis_types)
    assert make_mesh((4,), ("data",)).devices.size == 4
    assert make_mesh(2, "x").shape["x"] == 2


def test_wildcard_takes_the_remaining_devices():
    mesh = make_mesh({"data": -1, "tensor": 2})
    assert mesh.shape["data"] * 2 == jax.device_count()


def test_explicit_devices_must_match_the_mesh_size():
    devs = jax.devices()[:4]
    assert make_mesh({"data": 4}, devices=devs).devices.size == 4
    with pytest.raises(MlsysError, match="passed in devices="):
        make_mesh({"data": 2}, devices=devs)


@pytest.mark.parametrize("shape, names, match", [
    ((2, 2), ("a", "a"), "duplicate axis name"),
    ((2, 2), ("a",), "2 axis sizes but 1 axis names"),
    ((2,), None, "needs axis_names"),
    ((0,), ("a",), "sizes must be integers >= 1"),
    ((2.0,), ("a",), "sizes must be integers >= 1"),
    ((-1, -1), ("a", "b"), "only one axis may be -1"),
    ((), (), "at least one axis"),
    ((2,), ("my axis",), "identifiers"),
    ((3,), ("data",), "does not divide"),
    ((4096,), ("data",), "needs 4096 devices"),
])
def test_bad_meshes_get_clear_errors(shape, names, match):
    with pytest.raises(MlsysError, match=match):
        make_mesh(shape, names)


def test_dict_shape_with_axis_names_is_ambiguous():
    with pytest.raises(MlsysError, match="not both"):
        make_mesh({"data": 2}, axis_names=("data",))


def test_unknown_axis_names_are_rejected():
    mesh = make_mesh({"data": 4})
    require_axes(mesh, "data")
    assert axis_size(mesh, "data") == 4
    with pytest.raises(MlsysError, match="'tensor' is not in the mesh"):
        require_axes(mesh, "tensor", api="megatron_mlp")


def test_validate_divisible():
    assert validate_divisible(32, 4, "batch") == 8
    with pytest.raises(MlsysError, match="batch: 30 is not divisible by the axis size 4"):
        validate_divisible(30, 4, "batch")
    with pytest.raises(MlsysError, match="axis size >= 1"):
        validate_divisible(8, 0, "batch")
