"""The semantic view of linear ops: which axes of a contraction's output its weights own.

A :class:`LinearSite` is a ``conv_general_dilated`` or ``dot_general`` whose output a rule may
replace, or a named call whose body is exactly ``conv(x, W) + bias`` along the conv's feature axis
(what ``fold_conv_bn`` emits and ``models.conv_bias`` is), so the conv rules compose (§4.2). Its
``features`` are the output axes the weight operand owns — for a conv, ``dimension_numbers``'
output-feature axis; for a ``dot_general``, its batch axes and the weight's free axes — and
``weight_axes`` the matching axes of the weight. Scaling the output along ``features`` is scaling
the weight along ``weight_axes``: the algebra every fold rule shares, derived once here.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import ClosedJaxpr, Literal, Tracer
from mlsys_jax.ir.primitives import JIT
from mlsys_jax.ir.scaled import Scaled
from mlsys_jax.ir.widen import is_float
from mlsys_jax.passes.rewrite.axes import provenance

CONV, DOT = "conv_general_dilated", "dot_general"


@dataclass(frozen=True)
class LinearSite:
    """A contraction we may rewrite (see the module doc). ``b`` is a conv_bias call's bias
    argument (None for a bare contraction)."""

    index: int
    eqn: object
    op: object
    x: object
    w: object
    b: object
    out: object
    features: tuple
    weight_axes: tuple

    @property
    def params(self) -> dict:
        return self.op.params

    @property
    def kind(self) -> str:
        return "conv" if self.op.primitive.name == CONV else "dot"

    @property
    def feature_shape(self) -> tuple:
        return tuple(self.out.aval.shape[a] for a in self.features)

    @property
    def cuttable(self) -> tuple:
        """Which of ``features`` validation may cut (``passes/feature_cut.py``): a conv's output
        features unless it is grouped (a group reads its own input features), a dot_general's
        weight axes that are not batch axes (the input would be cut too)."""
        if self.kind == "conv":
            p = self.params
            return (0,) if p["feature_group_count"] == 1 and p["batch_group_count"] == 1 else ()
        batch = len(self.params["dimension_numbers"][1][0])
        return tuple(range(batch, len(self.features)))

    # -- convolutions ------------------------------------------------------------------------
    @property
    def dims(self):
        return self.params["dimension_numbers"]

    @property
    def window(self) -> tuple:
        shape = self.w.aval.shape
        return tuple(shape[d] for d in self.dims.rhs_spec[2:])

    @property
    def out_features(self) -> int:
        return self.w.aval.shape[self.dims.rhs_spec[0]]

    @property
    def feature_dim(self) -> int:
        return self.dims.out_spec[1]


def _conv_site(i, eqn, conv, x, w, b) -> LinearSite:
    dn = conv.params["dimension_numbers"]
    return LinearSite(i, eqn, conv, x, w, b, eqn.outvars[0], (dn.out_spec[1],), (dn.rhs_spec[0],))


def conv_bias_body(body):
    """If ``body`` (a ClosedJaxpr or open jaxpr) is ``conv(in0, in1) + bias(in2)`` with the bias
    proven (dataflow: ``axes.provenance``) to run along the conv's output-feature axis, its conv
    equation; else None."""
    j = getattr(body, "jaxpr", body)
    if len(j.invars) != 3 or len(j.outvars) != 1 or getattr(body, "consts", ()):
        return None
    convs = [e for e in j.eqns if e.primitive.name == CONV]
    if len(convs) != 1 or list(convs[0].invars) != list(j.invars[:2]) or not j.eqns:
        return None
    last = j.eqns[-1]
    z = convs[0].outvars[0]
    if last.primitive.name != "add" or last.outvars[0] is not j.outvars[0] \
            or [v is z for v in last.invars].count(True) != 1:
        return None
    other = next(v for v in last.invars if v is not z)
    if isinstance(other, Literal):
        return None
    rest = [e for e in j.eqns if e is not convs[0] and e is not last]
    producer = {e.outvars[0]: e for e in rest if len(e.outvars) == 1}
    origin = provenance(producer, other)
    fd = convs[0].params["dimension_numbers"].out_spec[1]
    if origin.source is not j.invars[2] or origin.axes != (fd,):
        return None  # a bias along another axis (H == C), or not the call's argument
    if len(rest) != len(producer) or any(e.primitive.name not in ("broadcast_in_dim", "reshape")
                                         for e in rest):
        return None
    return convs[0]


def is_conv_bias_call(eqn) -> bool:
    """A jit call that is one conv site: ``conv(x, W) + bias`` along its feature axis."""
    body = eqn.params.get("jaxpr")
    return eqn.primitive.name in JIT and isinstance(body, ClosedJaxpr) \
        and conv_bias_body(body) is not None


def convs(jaxpr) -> list[LinearSite]:
    """Every conv site of a level (a conv, or a conv_bias call), in program order."""
    sites = []
    for i, e in enumerate(jaxpr.eqns):
        if e.primitive.name == CONV and len(e.invars) == 2:
            sites.append(_conv_site(i, e, e, e.invars[0], e.invars[1], None))
        elif e.primitive.name in JIT and isinstance(e.params.get("jaxpr"), ClosedJaxpr):
            conv = conv_bias_body(e.params["jaxpr"])
            if conv is not None:
                sites.append(_conv_site(i, e, conv, *e.invars[:3]))
    return sites


def dot_site(i, eqn, weight_is_lhs: bool) -> LinearSite:
    """The site of a ``dot_general`` equation whose weight operand is its lhs or rhs."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars
    nb = len(lb)
    lfree = [a for a in range(lhs.aval.ndim) if a not in lc and a not in lb]
    rfree = [a for a in range(rhs.aval.ndim) if a not in rc and a not in rb]
    if weight_is_lhs:
        features = tuple(range(nb)) + tuple(nb + k for k in range(len(lfree)))
        w_axes = tuple(lb) + tuple(lfree)
        x, w = rhs, lhs
    else:
        features = tuple(range(nb)) + tuple(nb + len(lfree) + k for k in range(len(rfree)))
        w_axes = tuple(rb) + tuple(rfree)
        x, w = lhs, rhs
    return LinearSite(i, eqn, eqn, x, w, None, eqn.outvars[0], features, w_axes)


def dots(jaxpr, is_known) -> list[LinearSite]:
    """Every ``dot_general`` of a level with exactly one operand known (``is_known(atom)``): the
    weights of a Dense layer or projection, the other operand its input."""
    sites = []
    for i, e in enumerate(jaxpr.eqns):
        if e.primitive.name != DOT:
            continue
        known = [is_known(v) for v in e.invars]
        if known.count(True) == 1:
            sites.append(dot_site(i, e, weight_is_lhs=known[0]))
    return sites


# ---- the shared algebra ----------------------------------------------------------------------

def scale_weights(w, vec, site: LinearSite, dtype):
    """W ⊙ vec along the weight axes of the site's features (``vec``: the feature shape), as
    ``dtype``. A known W is scaled in float64 (or int64) NumPy and rounded once; a traced one
    by a multiply in its own dtype."""
    shape = [1] * len(site.w.aval.shape)
    for axis, n in zip(site.weight_axes, vec.shape):
        shape[axis] = n
    # vec's axes are in ``features`` order; the weight's axes may come in another order
    order = np.argsort(site.weight_axes)
    v = np.transpose(vec, order).reshape(shape)
    if not isinstance(w, Tracer):
        return _scale_known(np.asarray(w), v, dtype)
    return w * jax.numpy.asarray(v.astype(dtype))


_SCALE_BLOCK_BYTES = 1 << 20  # a known W is scaled a block of this many wide bytes at a time
# (a block that stays in cache: faster than a large one)


def _block_axis(shape: tuple, blocks: int) -> int:
    """The axis to cut into ``blocks`` pieces: the first long enough (an HWIO kernel's leading
    1×1 window axes are not), else the longest."""
    return next((a for a, n in enumerate(shape) if n >= blocks),
                int(np.argmax(shape)) if shape else 0)


def _scale_known(w: np.ndarray, v: np.ndarray, dtype):
    """``(w ⊙ v).astype(dtype)`` computed in ``v``'s wide dtype a block of ``w`` at a time: a
    whole wide copy of a large kernel (a factory's parameters) would take twice its size again.
    The result is aligned (:func:`aligned_empty`). Asked for in ``v``'s own dtype from narrower
    float weights (validation's float64 meaning of a fold), it is kept as its two factors
    (``ir.scaled``: a contraction reading it computes on ``w`` and scales its output)."""
    if w.ndim and np.dtype(dtype) == v.dtype and v.dtype.itemsize > w.dtype.itemsize \
            and is_float(w.dtype) and is_float(v.dtype):
        return Scaled(w, v)
    with np.errstate(over="ignore", invalid="ignore"):  # Inf is judged by validation
        if w.ndim == 0:
            return (w.astype(v.dtype) * v).astype(dtype)
        out = aligned_empty(w.shape, dtype)
        blocks = max(1, -(-w.size * v.dtype.itemsize // _SCALE_BLOCK_BYTES))
        axis = _block_axis(w.shape, blocks)
        n = w.shape[axis]
        step = max(1, -(-n // blocks))
        wide = np.empty(w.size // n * step, v.dtype)  # one product buffer: no allocation a block
        for start in range(0, n, step):
            cut = tuple(slice(start, start + step) if a == axis else slice(None)
                        for a in range(w.ndim))
            block = w[cut]
            part = v if v.shape[axis] == 1 else v[cut]
            product = wide[:block.size].reshape(block.shape)
            out[cut] = np.multiply(block, part, out=product, dtype=v.dtype)
    return out


def aligned_empty(shape: tuple, dtype, align: int = 64) -> np.ndarray:
    """``np.empty`` whose data starts on an ``align``-byte boundary. A rewrite's new constant is
    kept as the NumPy array it is; passed to a compiled program (the value check, ``--measure``)
    XLA:CPU reads an aligned one in place, and copies any other on every call."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def weights_overflow(level, site: LinearSite, vec) -> str | None:
    """Why W ⊙ vec does not fit the weights' dtype (an Inf where W is finite), or None; None too
    for traced weights (their product is computed in the program). Rounding is monotone, so a
    feature overflows only if its largest finite |w| does: the product is computed for those
    features alone, not for the whole kernel (which the rewrite then scales once)."""
    w = level.value(site.w)
    if w is None or not is_float(np.asarray(w).dtype):
        return None
    w = np.asarray(w)
    dtype = w.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.asarray(vec)
        if not np.isfinite(v).all():  # a NaN or Inf scale: count it the long way
            return _overflowed(w, scale_weights(w, vec, site, dtype))
        others = tuple(a for a in range(w.ndim) if a not in site.weight_axes)
        # the largest |w| of each feature (NaN ignored; an Inf in W takes the long way below)
        peak = np.fmax(np.fmax.reduce(w, axis=others), -np.fmin.reduce(w, axis=others))
        # peak's axes are the weight axes in increasing order; vec's are in features order
        scale = np.abs(np.transpose(v, np.argsort(site.weight_axes)))
        hot = ~np.isfinite(np.multiply(peak, scale, dtype=v.dtype).astype(dtype))
        if not hot.any():
            return None  # as scale_weights computes each element: |w·v| rounds as |w|·|v|
        folded = scale_weights(w, vec, site, dtype)
    return _overflowed(w, folded)


def _overflowed(w, folded) -> str | None:
    new = np.isfinite(w) & ~np.isfinite(folded)
    if not new.any():
        return None
    return (f"the folded weights overflow {w.dtype} (at most {float(jnp.finfo(w.dtype).max):.6g}): "
            f"{int(new.sum())} of {new.size} are Inf; left as it was")


def along(vec, ndim: int, axes: tuple):
    """A feature-shaped vector (axes in features order) as an ``ndim``-D array along ``axes``,
    size 1 elsewhere (it broadcasts against the output as a bias does)."""
    order = tuple(int(k) for k in np.argsort(axes))
    xp = lax if isinstance(vec, Tracer) else np  # a known vector stays a NumPy constant
    if len(axes) > 1:
        vec = xp.transpose(vec, order)
    shape = [1] * ndim
    for a, n in zip(sorted(axes), vec.shape):
        shape[a] = n
    if xp is np:
        return np.reshape(vec, shape)
    return lax.broadcast_in_dim(vec, tuple(shape), tuple(sorted(axes)))


def emit_conv(em, site: LinearSite, x, w, b=None, **param_overrides):
    """The site's conv on new weights (and params), plus a bias as one named op ``conv_bias``
    (like models.conv_bias, in the conv's own layout, strides, padding and groups)."""
    conv = site.op

    def conv_only(x, w):
        return em.bind(conv, [x, w], **param_overrides)[0]

    if b is None:
        return conv_only(x, w)

    def conv_bias(x, w, b):
        z = conv_only(x, w)
        return z + along(b.astype(z.dtype), z.ndim, site.features)

    return em.call(conv_bias, x, w, b)


def emit_dot(em, site: LinearSite, x, w, b=None):
    """The site's dot_general on new weights, plus a bias along its features (inline: a Dense
    layer's ``x @ W + b``)."""
    args = [w, x] if site.op.invars[0] is site.w else [x, w]
    z = em.bind(site.op, args)[0]
    if b is None:
        return z
    b = b.astype(z.dtype) if isinstance(b, Tracer) else np.asarray(b).astype(z.dtype)
    return z + along(b, z.ndim, site.features)


# ---- two convs side by side --------------------------------------------------------------------

def fmt_window(site: LinearSite) -> str:
    return "×".join(map(str, site.window))


def conv_difference(a: LinearSite, b: LinearSite, same_window: bool = True) -> str | None:
    """The first attribute in which two convs on the same input differ (None: mergeable)."""
    pa, pb = a.params, b.params
    if same_window and a.window != b.window:
        return f"window size differs: {fmt_window(a)} vs {fmt_window(b)}"
    for key, label in (("window_strides", "strides"), ("rhs_dilation", "dilation"),
                       ("lhs_dilation", "lhs dilation"), ("feature_group_count", "groups"),
                       ("batch_group_count", "batch groups"), ("precision", "precision"),
                       ("preferred_element_type", "output dtype"),
                       ("dimension_numbers", "layout"), ("padding", "padding")):
        if key == "padding" and not same_window:
            continue
        if pa.get(key) != pb.get(key):
            return f"{label} differs: {pa.get(key)} vs {pb.get(key)}"
    if a.w.aval.dtype != b.w.aval.dtype or a.out.aval.dtype != b.out.aval.dtype:
        return f"dtype differs: {a.w.aval.dtype} vs {b.w.aval.dtype}"
    ia, ib = a.w.aval.shape[a.dims.rhs_spec[1]], b.w.aval.shape[b.dims.rhs_spec[1]]
    if ia != ib:
        return f"kernel input features differ: {ia} vs {ib}"
    return None
