"""Device meshes for shard_map, validated up front with our own messages (docs/jax-notes.md "shard_map and meshes").

JAX is quiet on several bad meshes: duplicate axis names collapse, a 3-device mesh on 8 devices
silently takes devices 0-2, a psum over an unknown axis raises a bare AssertionError. Every
parallel API here builds its mesh through :func:`make_mesh` and checks axes with
:func:`require_axes`, so a wrong layout fails with a sentence, not deep inside XLA.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh

from mlsys_jax.errors import MlsysError


def make_mesh(shape: Mapping[str, int] | Sequence[int], axis_names: Sequence[str] | None = None,
              devices: Sequence | None = None) -> Mesh:
    """A mesh with Auto axes over ``devices`` (default: all devices), validated.

    ``shape`` is ``{"data": 2, "tensor": 4}`` or a tuple of sizes with ``axis_names``. One size
    may be -1: it takes the remaining devices. Without explicit ``devices`` the mesh size must
    divide the number of available devices (the first ones are used); with explicit ``devices``
    it must equal their number. Axes are ``AxisType.Auto`` so shard_map accepts plain arrays.
    """
    sizes, names = _shape_and_names(shape, axis_names)
    explicit = devices is not None
    devs = list(jax.devices() if devices is None else devices)
    if not devs:
        raise MlsysError("make_mesh: got an empty device list; pass devices=None to use all devices")
    sizes = _fill_wildcard(sizes, names, len(devs))
    total = math.prod(sizes)
    layout = _layout(names, sizes)
    if total > len(devs):
        raise MlsysError(f"make_mesh: mesh {layout} needs {total} devices but only {len(devs)} "
                         f"are available; use fewer/smaller axes or start with --devices {total}")
    if explicit and total != len(devs):
        raise MlsysError(f"make_mesh: mesh {layout} has {total} devices but {len(devs)} were "
                         "passed in devices=; pass exactly as many devices as the mesh has")
    if len(devs) % total:
        raise MlsysError(f"make_mesh: mesh {layout} of {total} devices does not divide the "
                         f"{len(devs)} available devices; choose sizes whose product divides "
                         f"{len(devs)} (or pass devices= explicitly)")
    return jax.make_mesh(tuple(sizes), tuple(names), axis_types=(AxisType.Auto,) * len(names),
                         devices=devs[:total])


def require_axes(mesh: Mesh, *names: str, api: str = "parallel") -> None:
    """Raise MlsysError unless every name in ``names`` is an axis of ``mesh``."""
    unknown = [n for n in names if n not in mesh.axis_names]
    if unknown:
        raise MlsysError(f"{api}: axis {', '.join(map(repr, unknown))} is not in the mesh "
                         f"(axes: {', '.join(map(repr, mesh.axis_names))}); build the mesh with "
                         f"make_mesh({{{unknown[0]!r}: N, ...}}) or pass an existing axis name")


def validate_divisible(n: int, axis_size: int, what: str) -> int:
    """Return ``n // axis_size``; raise MlsysError naming ``what`` if it does not divide."""
    if not isinstance(n, int) or not isinstance(axis_size, int) or axis_size < 1 or n < 0:
        raise MlsysError(f"{what}: expected a count >= 0 and an axis size >= 1, "
                         f"got {n!r} and {axis_size!r}")
    if n % axis_size:
        lo, hi = n - n % axis_size, n + axis_size - n % axis_size
        raise MlsysError(f"{what}: {n} is not divisible by the axis size {axis_size}; "
                         f"use a multiple of {axis_size} (e.g. {lo or hi} or {hi})")
    return n // axis_size


def axis_size(mesh: Mesh, name: str) -> int:
    """Size of one named mesh axis (validated)."""
    require_axes(mesh, name, api="axis_size")
    return int(mesh.shape[name])


def _shape_and_names(shape, axis_names) -> tuple[list[int], list[str]]:
    if isinstance(shape, Mapping):
        if axis_names is not None:
            raise MlsysError("make_mesh: give axis names either as the keys of a shape dict or "
                             "as axis_names= with a tuple shape, not both")
        names, sizes = list(shape.keys()), list(shape.values())
    else:
        if isinstance(shape, int):
            shape = (shape,)
        sizes = list(shape)
        if axis_names is None:
            raise MlsysError(f"make_mesh: shape {tuple(sizes)} needs axis_names=(...) "
                             "(or pass a dict like {'data': 8})")
        names = [axis_names] if isinstance(axis_names, str) else list(axis_names)
    if not sizes:
        raise MlsysError("make_mesh: the mesh needs at least one axis, e.g. {'data': 8}")
    if len(names) != len(sizes):
        raise MlsysError(f"make_mesh: {len(sizes)} axis sizes but {len(names)} axis names "
                         f"{tuple(names)}; give one name per axis")
    for n in names:
        if not isinstance(n, str) or not n.isidentifier():
            raise MlsysError(f"make_mesh: axis names must be identifiers like 'data', got {n!r}")
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise MlsysError(f"make_mesh: duplicate axis name(s) {', '.join(map(repr, dups))} in "
                         f"{tuple(names)}; every mesh axis needs its own name")
    for n, s in zip(names, sizes):
        if isinstance(s, bool) or not isinstance(s, int) or (s < 1 and s != -1):
            raise MlsysError(f"make_mesh: axis {n!r} has size {s!r}; sizes must be integers "
                             ">= 1 (or -1 once, for 'the remaining devices')")
    return [int(s) for s in sizes], [str(n) for n in names]


def _fill_wildcard(sizes: list[int], names: list[str], n_devices: int) -> list[int]:
    if sizes.count(-1) > 1:
        raise MlsysError(f"make_mesh: only one axis may be -1, got {_layout(names, sizes)}")
    if -1 in sizes:
        rest = math.prod(s for s in sizes if s != -1)
        if n_devices % rest:
            raise MlsysError(f"make_mesh: the other axes ({rest} devices) do not divide the "
                             f"{n_devices} devices, so -1 in {_layout(names, sizes)} is undefined")
        sizes = [n_devices // rest if s == -1 else s for s in sizes]
    return sizes


def _layout(names: Sequence[str], sizes: Sequence[int]) -> str:
    return "{" + ", ".join(f"{n!r}: {s}" for n, s in zip(names, sizes)) + "}"
