"""Binding equations again on fewer examples: a region evaluated on one row of its batch, or on
some of its output features.

Translation validation (``passes/validate.py``) runs a rewrite's region and its replacement on
seeded inputs; at a real model's size that is a real conv, several times over. Most regions treat
the examples of a batch alike, so one example stands for all of them: :func:`rebind` binds an
equation whose inputs have fewer rows along some axes than it was traced with, adjusting the shape
params that follow the rows (``broadcast_in_dim``'s shape, ``reshape``'s new sizes) and slicing a
full-size constant operand of an elementwise op alike. It raises :class:`Unshrinkable` unless
the equation provably treats those rows independently: elementwise ops, movement views that keep
the axis whole, reductions along other axes, a conv's batch axis, a ``dot_general``'s free axes
(and batch axes, both operands sliced), named calls (body by body). Reductions and contractions
over the axis, gathers and everything else keep their full batch.

A full-size operand cut to its first rows must be the same in every row (a broadcast, a
per-channel table), else :class:`Unshrinkable`: the rows kept then compute what every dropped
row computes, which is what lets one stand for all.

Inside :func:`growing` an axis traced with length one may carry more rows instead (validation's
draws stacked as rows of a batch of one): an elementwise op broadcasts its operands of one row
to them, and ``broadcast_in_dim`` keeps them where it kept the one; every other equation treats
them by the same rules, so each row is computed as that row alone would be.

The rows kept are the first ones, unless ``picks`` says otherwise: ``{(length, kept): indices}``
names, for an axis traced with ``length`` and cut to ``kept``, which ones (validation's cut of a
linear site's output features, ``passes/feature_cut.py``); a full-size operand is then sliced at
those indices (a view where they are consecutive: :func:`take`). A conv's kernel may be cut so
along its output features, ungrouped, and nowhere else (a rewrite may still bind a conv with a
kernel of its own).

A conv's image may be cropped along its spatial axes too (:func:`crop_length`): each output
position computes one function of its window, which depends on the position only through which
of the kernel's taps fall on padding (its *border type*). A crop that keeps every border type of
the full image, with the same alignment to the stride at the far edge, tests every function the
full image computes. That holds for one image at a time: a conv reading a cropped conv's output
sees borders of borders, so each side of a validation (:func:`side`, inside :func:`cropping`)
may crop the convs of one image only — those that read that very array (parallel convs, as a
merge of them reads it), not a value computed from one of them — and every cropped conv, on
both sides, must have the same geometry (two paddings would pair border types the crop may
not pair).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math

import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.contexts import setting
from mlsys_jax.ir.primitives import ELEMENTWISE, REDUCTIONS, TRANSPARENT_CALLS
from mlsys_jax.ir.walk import bodies

SHAPE_FREE = frozenset({"squeeze", "transpose", "expand_dims"}) | ELEMENTWISE


class Unshrinkable(Exception):
    """The equation may mix the rows being dropped with the ones kept."""


class _Ledger:
    """The cropped convs of one validation attempt: their common geometry, and the image the
    side being evaluated has cropped a conv of (None: none yet)."""

    def __init__(self):
        self.geometry, self.image = None, None


_CROPS: contextvars.ContextVar = contextvars.ContextVar("mlsys_jax_rebatch_crops", default=None)
_GROWING: contextvars.ContextVar = contextvars.ContextVar("mlsys_jax_rebatch_grow",
                                                         default=False)


def growing():
    """Inside, an axis traced with length one may carry more rows (see the module doc)."""
    return setting(_GROWING, True)


def cropping():
    """Inside, a conv may read an image cropped along its spatial axes (see the module doc)."""
    return setting(_CROPS, _Ledger())


@contextlib.contextmanager
def side():
    """One side of the comparison (the region, or its replacement) is evaluated inside: it may
    crop the convs of one image."""
    ledger = _CROPS.get()
    if ledger is not None:
        ledger.image = None
    yield


def border_types(n: int, *, kernel: int, stride: int, padding: tuple, dilation: int) -> list:
    """Per output position of a conv over ``n`` pixels along one axis: how many of the kernel's
    taps fall on the low padding and how many on the high.

    >>> border_types(5, kernel=3, stride=1, padding=(1, 1), dilation=1)
    [(1, 0), (0, 0), (0, 0), (0, 0), (0, 1)]
    """
    lo, hi = padding
    span = (kernel - 1) * dilation + 1
    out = (n + lo + hi - span) // stride + 1
    types = []
    for o in range(max(out, 0)):
        taps = [o * stride - lo + t * dilation for t in range(kernel)]
        types.append((sum(i < 0 for i in taps), sum(i >= n for i in taps)))
    return types


@functools.lru_cache(maxsize=1024)
def crop_length(n: int, *, kernel: int, stride: int, padding: tuple, dilation: int) -> int:
    """The fewest pixels along one axis on which a conv meets every border type it meets on
    ``n``, with ``n`` minus them a multiple of the stride (the far edge aligned alike); ``n``
    where no fewer do."""
    geometry = dict(kernel=kernel, stride=stride, padding=padding, dilation=dilation)
    for m in range(n % stride or stride, n, stride):
        if _covers(m, n, **geometry):
            return m
    return n


@functools.lru_cache(maxsize=4096)
def _covers(m: int, n: int, **geometry) -> bool:
    """On ``m`` pixels the conv meets every border type it meets on ``n``, aligned alike."""
    return (n - m) % geometry["stride"] == 0 and m > 0 and \
        set(border_types(m, **geometry)) >= set(border_types(n, **geometry))


def window_geometry(params: dict, kernel_shape: tuple) -> list[dict]:
    """Per spatial axis of a ``conv_general_dilated`` (its params, its kernel's shape): the
    keywords of :func:`border_types` and :func:`crop_length` along that axis."""
    dn = params["dimension_numbers"]
    return [dict(kernel=kernel_shape[a], stride=params["window_strides"][i],
                 padding=tuple(params["padding"][i]), dilation=params["rhs_dilation"][i])
            for i, a in enumerate(dn.rhs_spec[2:])]


def _crop(eqn, image, old: tuple, new: tuple, kernel: tuple) -> None:
    """Allow a conv's ``image``, traced ``old``, cut to ``new`` along spatial axes
    (Unshrinkable otherwise): each axis keeps every border type, one image cropped per side
    (convs that read that very array, not a value computed from one of them), one geometry
    per attempt."""
    p, dn = eqn.params, eqn.params["dimension_numbers"]
    ledger = _CROPS.get()
    if ledger is None or (ledger.image is not None and ledger.image is not image):
        raise Unshrinkable("conv rows other than its batch" if ledger is None
                           else "a second cropped conv on one side")
    if any(d != 1 for d in p["lhs_dilation"]):
        raise Unshrinkable("a transposed conv's image is not cropped")
    geometries = window_geometry(p, kernel)
    sizes = []
    for axis, geometry in zip(dn.lhs_spec[2:], geometries):
        n, m = old[axis], new[axis]
        if m != n and not _covers(m, n, **geometry):
            raise Unshrinkable("the crop misses a border type of the conv")
        sizes.append((n, m))
    shape = (tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec), tuple(sizes),
             tuple(tuple(sorted(g.items())) for g in geometries))
    if ledger.geometry is not None and ledger.geometry != shape:
        raise Unshrinkable("the two sides crop convs of different geometry")
    ledger.geometry, ledger.image = shape, image


def _shape(x) -> tuple:
    shape = getattr(x, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(x))


def _changed(old: tuple, new: tuple) -> list:
    return [a for a, (o, n) in enumerate(zip(old, new)) if o != n]


def _slice_to(x, shape: tuple, picks=None):
    """``x`` cut to ``shape`` along the axes where it is longer (its first rows, or ``picks``).
    Cut to its first rows, a full-size operand (a constant, or computed from constants alone)
    must be the same in every row (:func:`uniform`): the rows kept then stand for the ones
    dropped, which compute the same function of their own inputs."""
    for axis, (m, n) in enumerate(zip(_shape(x), shape)):
        if m > n:
            keep = (picks or {}).get((m, n))
            if keep is None and not uniform(x, axis):
                raise Unshrinkable(f"a constant differs along axis {axis}: its rows are not alike")
            x = x[tuple(slice(0, n) if a == axis else slice(None) for a in range(len(shape)))] \
                if keep is None else take(x, keep, axis)
    return x


def uniform(x, axis: int) -> bool:
    """Every row of ``x`` along ``axis`` equals its first, bit for bit (a broadcast: at once)."""
    try:
        x = np.asarray(x)
    except TypeError:  # a PRNG key array: no bits to compare here
        return False
    if x.strides[axis] == 0 or x.shape[axis] <= 1:
        return True
    bits = x.view(_bits(x.dtype))
    first = bits[(slice(None),) * axis + (slice(0, 1),)]
    step = max(1, _BLOCK // max(first.size, 1))  # rows compared at a time: no full-size temporary
    for i in range(1, x.shape[axis], step):
        if not (bits[(slice(None),) * axis + (slice(i, i + step),)] == first).all():
            return False
    return True


_BLOCK = 1 << 20  # elements


def _bits(dtype) -> np.dtype:
    """An unsigned integer type of ``dtype``'s width (NaNs and signed zeros compared as bits)."""
    dtype = np.dtype(dtype)
    return np.dtype(f"u{dtype.itemsize}") if dtype.itemsize in (1, 2, 4, 8) else dtype


def take(x, keep, axis: int):
    """``x`` at indices ``keep`` (sorted) along ``axis``: a view where they are consecutive (a
    cut of a 512 MiB kernel's features is then no gather over all of it), else a copy."""
    x = np.asarray(x)
    keep = np.asarray(keep)
    if keep.size and int(keep[-1]) - int(keep[0]) + 1 == keep.size:
        return x[(slice(None),) * (axis % x.ndim) + (slice(int(keep[0]), int(keep[-1]) + 1),)]
    return np.take(x, keep, axis=axis)


def _elementwise(eqn, args, picks=None) -> list:
    """An elementwise op's operands made to agree: a full-size operand (a constant) is cut to the
    rows the shrunk ones keep (unit axes still broadcast)."""
    shapes = [_shape(a) for a in args]
    full = [(s, tuple(v.aval.shape)) for s, v in zip(shapes, eqn.invars)
            if len(s) == len(getattr(v.aval, "shape", ())) > 0]
    if not full:
        return args
    rank = len(full[0][1])
    grow = _GROWING.get()
    # along each axis, the rows every operand that was not broadcast there (size > 1) keeps;
    # growing, an axis traced with one row takes the most any operand carries there
    target = tuple(min((s[d] for s, o in full if o[d] != 1),
                       default=max(s[d] for s, _ in full) if grow else 1)
                   for d in range(rank))
    return [_rows(_slice_to(a, target, picks), target) if len(s) == rank and s != target
            else a for a, s in zip(args, shapes)]


def _rows(x, shape: tuple):
    """``x`` broadcast along the axes where it has one row and ``shape`` more (growing)."""
    if _shape(x) == shape:
        return x
    if isinstance(x, np.ndarray) or np.isscalar(x):
        return np.broadcast_to(x, shape)
    import jax.numpy as jnp

    return jnp.broadcast_to(x, shape)


def _params(eqn, args, picks=None) -> dict:
    """The equation's params for inputs of the shapes of ``args`` (or Unshrinkable)."""
    prim, p = eqn.primitive.name, eqn.params
    if prim in SHAPE_FREE:
        return p
    old = [tuple(v.aval.shape) for v in eqn.invars]
    new = [_shape(a) for a in args]
    if prim == "broadcast_in_dim":
        shape = list(p["shape"])
        for i, d in enumerate(p["broadcast_dimensions"]):
            if old[0][i] != 1 or (_GROWING.get() and p["shape"][d] == 1):
                shape[d] = new[0][i]
        return {**p, "shape": tuple(shape)}
    if prim == "reshape":
        if p.get("dimensions") is not None:
            raise Unshrinkable("reshape with a transpose")
        axes = _changed(old[0], new[0])
        sizes = list(p["new_sizes"])
        for a in axes:  # the axis must survive whole: same size and the same stride after it
            stride = math.prod(old[0][a + 1:])
            hit = [j for j, n in enumerate(p["new_sizes"]) if n == old[0][a]
                   and math.prod(p["new_sizes"][j + 1:]) == stride]
            if len(hit) != 1 or any(o != n for o, n in zip(old[0][a + 1:], new[0][a + 1:])):
                raise Unshrinkable("reshape regroups the rows")
            sizes[hit[0]] = new[0][a]
        return {**p, "new_sizes": tuple(sizes)}
    if prim == "conv_general_dilated":  # (a rewrite may bind it with another kernel: its own)
        dn = p["dimension_numbers"]
        if set(_changed(old[0], new[0])) - {dn.lhs_spec[0]} - set(dn.lhs_spec[2:]):
            raise Unshrinkable("conv rows other than its batch")
        if _changed(old[0], new[0]) and p["batch_group_count"] != 1:
            raise Unshrinkable("conv batch groups mix the rows")
        if set(_changed(old[0], new[0])) & set(dn.lhs_spec[2:]):
            if set(_changed(old[1], new[1])) & set(dn.rhs_spec[2:]):
                raise Unshrinkable("conv kernel cut along its window")
            _crop(eqn, args[0], old[0], new[0], tuple(old[1]))
        cut = [a for a in _changed(old[1], new[1]) if (old[1][a], new[1][a]) in (picks or {})]
        if cut and (cut != [dn.rhs_spec[0]] or p["feature_group_count"] != 1
                    or p["batch_group_count"] != 1):
            raise Unshrinkable("conv kernel cut other than along ungrouped output features")
        return p
    if prim == "dot_general":
        (lc, rc), _ = p["dimension_numbers"]
        if set(_changed(old[0], new[0])) & set(lc) or set(_changed(old[1], new[1])) & set(rc):
            raise Unshrinkable("dot_general contracts the rows")
        return p
    if prim in REDUCTIONS and "axes" in p and not set(_changed(old[0], new[0])) & set(p["axes"]):
        return p  # reduced along other axes: each row on its own
    raise Unshrinkable(prim)


def rebind(eqn, args, bind, picks=None) -> list:
    """``eqn`` on ``args`` (fewer rows than it was traced with, or the same), through
    ``bind(eqn, args)``; ``picks``: which rows a cut axis keeps (see the module doc). Calls run
    their body, equation by equation."""
    old = [tuple(getattr(v.aval, "shape", ())) for v in eqn.invars]
    if [_shape(a) for a in args] == old:
        return bind(eqn, args)
    name = eqn.primitive.name
    inner = bodies(eqn) if name in TRANSPARENT_CALLS else []
    if len(inner) == 1:
        b = inner[0]
        env = dict(zip(b.jaxpr.constvars, b.consts))
        env.update(zip(b.jaxpr.invars, args))
        for e in b.jaxpr.eqns:
            vals = [v.val if type(v) is Literal else env[v] for v in e.invars]
            env.update(zip(e.outvars, rebind(e, vals, bind, picks)))
        return [v.val if type(v) is Literal else env[v] for v in b.jaxpr.outvars]
    if name in ELEMENTWISE:
        args = _elementwise(eqn, args, picks)
    if name == "dot_general":
        args = _dot_batch(eqn, args, picks)
    params = _params(eqn, args, picks)
    return bind(eqn if params is eqn.params else eqn.replace(params=params), args)


def _dot_batch(eqn, args, picks=None) -> list:
    """A dot_general's batch axes cut alike on both operands."""
    _, (lb, rb) = eqn.params["dimension_numbers"]
    a, b = args
    for i, j in zip(lb, rb):
        n = min(_shape(a)[i], _shape(b)[j])
        a = _slice_to(a, tuple(n if k == i else m for k, m in enumerate(_shape(a))), picks)
        b = _slice_to(b, tuple(n if k == j else m for k, m in enumerate(_shape(b))), picks)
    return [a, b]
