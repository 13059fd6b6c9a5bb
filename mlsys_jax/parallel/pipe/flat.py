"""Heterogeneous per-stage values in one SPMD program: arrays laid out in flat buffers per dtype.

Under ``shard_map`` every device runs the same program on buffers of the same shapes, but a
user's stages hold different parameters and hand on activations of different shapes. Each stage's
values are therefore laid out in one flat buffer per dtype (:class:`FlatLayout`), and the layouts
of all stages are padded to a common size per dtype (:func:`padded_family`): a stage reads its own
values back with static slices. The padding is the price of one SPMD program; it is counted
(``FlatLayout.nbytes`` beside ``padded_bytes``) wherever a figure depends on it.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import weak_as
from mlsys_jax.errors import MlsysError


def dtype_key(dtype) -> str:
    """``'float32'``, ``'bfloat16'``, ``'int32'``: the buffer a value of ``dtype`` goes in."""
    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        raise MlsysError(f"pipeline: a {dtype} value (a PRNG key) would cross a stage boundary or "
                         "sit among the stage's parameters; pass keys in the batch or close over "
                         "them in the loss")
    return np.dtype(dtype).name


class FlatLayout:
    """Where each of a list of arrays (shapes, dtypes) sits in flat buffers ``{dtype: [n]}``."""

    def __init__(self, avals: Sequence, sizes: dict[str, int] | None = None):
        self.avals = list(avals)
        self.entries = []             # (dtype key, offset, shape, weak_type)
        need: dict[str, int] = {}
        for a in self.avals:
            key, n = dtype_key(a.dtype), math.prod(a.shape)
            self.entries.append((key, need.get(key, 0), tuple(a.shape),
                                 bool(getattr(a, "weak_type", False))))
            need[key] = need.get(key, 0) + n
        self.need = need
        sizes = dict(need) if sizes is None else dict(sizes)
        short = [k for k, n in need.items() if sizes.get(k, 0) < n]
        if short:
            raise MlsysError(f"FlatLayout: buffer sizes {sizes} too small for {need}")
        self.sizes = {k: n for k, n in sorted(sizes.items()) if n > 0}

    def padded(self, sizes: dict[str, int]) -> "FlatLayout":
        """The same entries in buffers of ``sizes`` (every buffer at least as large as needed)."""
        return FlatLayout(self.avals, sizes)

    @property
    def nbytes(self) -> int:
        """Bytes of the values themselves (no padding)."""
        return sum(n * np.dtype(k).itemsize for k, n in self.need.items())

    @property
    def padded_bytes(self) -> int:
        """Bytes of the buffers, padding included."""
        return sum(n * np.dtype(k).itemsize for k, n in self.sizes.items())

    def structs(self, lead: tuple = ()) -> dict:
        """``{dtype: ShapeDtypeStruct(lead + (n,))}`` of the buffers."""
        return {k: jax.ShapeDtypeStruct(lead + (n,), np.dtype(k)) for k, n in self.sizes.items()}

    def zeros(self, lead: tuple = ()) -> dict:
        """One zero buffer per dtype, with ``lead`` axes in front (gradients' accumulators)."""
        return {k: jnp.zeros(lead + (n,), np.dtype(k)) for k, n in self.sizes.items()}

    def pack(self, values: Sequence) -> dict:
        """Traced: the values raveled into their buffers, zero padding after them."""
        parts: dict[str, list] = {k: [] for k in self.sizes}
        for (key, _, shape, _), v in zip(self.entries, values, strict=True):
            if math.prod(shape):
                parts[key].append(jnp.ravel(v).astype(np.dtype(key)))
        out = {}
        for key, n in self.sizes.items():
            pad = n - self.need.get(key, 0)
            chunks = parts[key] + ([jnp.zeros((pad,), np.dtype(key))] if pad else [])
            out[key] = chunks[0] if len(chunks) == 1 else jnp.concatenate(chunks)
        return out

    def unpack(self, buffers: dict, empty=None) -> list:
        """Traced: the values read back from their buffers (static slices), weak types kept;
        a value with no elements is ``empty(aval)`` if given (else zeros)."""
        out = []
        for a, (key, off, shape, weak) in zip(self.avals, self.entries):
            if not math.prod(shape):
                out.append(empty(a) if empty else jnp.zeros(shape, np.dtype(key)))
            else:
                out.append(weak_as(buffers[key][off: off + math.prod(shape)].reshape(shape),
                                   weak))
        return out

    def pack_host(self, values: Sequence) -> dict:
        """NumPy: the same layout on the host (to place a state on the mesh)."""
        out = {k: np.zeros((n,), np.dtype(k)) for k, n in self.sizes.items()}
        for (key, off, shape, _), v in zip(self.entries, values, strict=True):
            if math.prod(shape):
                out[key][off: off + math.prod(shape)] = np.ravel(np.asarray(v))
        return out

    def unpack_host(self, buffers: dict) -> list:
        """NumPy: the values read back from host buffers."""
        return [np.asarray(buffers[key])[off: off + math.prod(shape)].reshape(shape)
                if math.prod(shape) else np.zeros(shape, np.dtype(key))
                for key, off, shape, _ in self.entries]


def padded_family(layouts: Sequence[FlatLayout]) -> list[FlatLayout]:
    """The layouts padded to one size per dtype (the largest any of them needs)."""
    sizes: dict[str, int] = {}
    for lay in layouts:
        for k, n in lay.need.items():
            sizes[k] = max(sizes.get(k, 0), n)
    return [lay.padded(sizes) for lay in layouts]


def stack_host(buffers: Sequence[dict]) -> dict:
    """Per-stage host buffers ``[{dtype: [n]}]`` as ``{dtype: [stages, n]}``."""
    return {k: np.stack([b[k] for b in buffers]) for k in buffers[0]}


def add(a: dict, b: dict) -> dict:
    """Add two per-dtype buffer dicts key by key."""
    return {k: a[k] + b[k] for k in a}
