"""Translation validation on a cut of a linear site's output features, where its weights are large.

A rewrite of a factory's 512 MiB kernel would be validated by running that kernel — in float64,
a 1 GiB copy — on every draw, on both sides. But each output feature of a conv or ``dot_general``
reads only its own slice of the weights, and the per-feature ops a fold removes read only that
feature's constants. So where the site's weights are large, the region and its replacement run on
``KEEP`` of its output features along one axis: the first two, the last two (where an
off-by-one lands) and a seeded sample of the rest (``keep``). The kernel is sliced along its
output-feature axis; full-size constants after it are sliced alike as each equation binds
(``ir.rebatch``'s ``picks``), and the rule's own per-feature vectors through ``Emit.features``.
``ir.rebatch`` raises where an equation could mix the features (a reduction or contraction over
them, a reshape that regroups them, a grouped conv), and validation then runs whole.

What a cut proves: on the kept features, every element of the region's outputs agrees with the
replacement's, as whole-region validation judges it (docs/verification.md §1); at every other
feature, that the constants the rewrite ships are those the rule computes from that feature's
values (below), and ``optimize``'s value check still compares every element. It relies on the
rule computing each feature of its replacement from that feature's values only, as the fold
algebra does (``rewrite/linear.py``); a replacement that cannot run on the cut is validated
whole. Every log line of a rewrite validated so says so (:meth:`Cut.describe`).

Every feature, not a sample, of what the rewrite ships (:func:`coverage`). A rule handed the
whole kernel may compute feature 1000 of 1024 otherwise than it does handed a cut that holds it
(an index into the whole array, a slip at one size): no cut of the features ever reads the
folded constant the program ships, so validating every feature on cuts would not see it. So
before the sample is validated, the replacement is traced in the program's dtypes
(``jax.make_jaxpr``: no value computed but the rule's own NumPy arithmetic on constants) once
whole — the constants it binds are those the rewrite splices into the program, by the same
emit — and once on each of the consecutive cuts that cover all the features (:func:`windows`:
at most as many features as ``WINDOW_BYTES`` of weights hold and half of them, spread evenly;
at least ``KEEP``), one at a time. Every constant it binds on a cut must be, bit for bit, the
whole one's at those features, and every equation the same but for the features' length. Where
a constant differs, the region is validated whole (the test that judges the constants the
program ships), and a refusal says where it differed; where the replacement cannot be traced
or compared so, it is validated whole too. So the cut's verdict holds at every output feature
whose constants the rule derives from that feature's values alone, as at the sampled ones; a
rule wrong only on features of some value (not of some index) is judged on the sample, and by
``optimize``'s value check on every element.
"""
from __future__ import annotations

import contextvars
from dataclasses import dataclass

import jax
import numpy as np

from mlsys_jax.compat import Literal, Tracer, bind_equation
from mlsys_jax.contexts import setting
from mlsys_jax.ir import aval_bytes
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.ir.rebatch import take
from mlsys_jax.ir.walk import bodies
from mlsys_jax.ir.widen import is_float

CUT_ABOVE = 1 << 24   # bytes of a site's weights from which its region runs on a cut: below,
# validating whole (the stronger test) is no slower than the cut and its coverage traces, and its
# float64 copies are small
WINDOW_BYTES = 1 << 22  # bytes of weights a cut of the coverage check holds at most
KEEP = 64             # output features kept: the first two, the last two and a seeded sample
EDGES = 2             # kept at each end
_TRACING = contextvars.ContextVar("mlsys_jax_feature_cut_tracing", default=False)


@dataclass(frozen=True)
class Site:
    """What a region says about the linear site it rewrites (``rules/linear.LinearSite``): its
    weights, the weight axes that own its output features, the feature axes' sizes, those of
    them a cut may slice (none for a grouped conv or a dot's batch axes), a conv_bias call's
    bias (feature-shaped), if any, and the value the weights are applied to (``operand``)."""

    weight: object
    weight_axes: tuple
    sizes: tuple
    cuttable: tuple
    bias: object = None
    operand: object = None


@dataclass(frozen=True)
class Cut:
    """Output features ``keep`` (sorted) of ``size`` along feature axis ``axis`` of ``site``."""

    site: Site
    axis: int
    keep: np.ndarray
    size: int

    @property
    def picks(self) -> dict:
        """For ``ir.rebatch``: an axis of ``size`` cut to ``len(keep)`` keeps ``keep``."""
        return {(self.size, len(self.keep)): self.keep}

    def vector(self, v):
        """A feature-shaped value (axes in the site's features order) at the kept features."""
        return take(v, self.keep, self.axis)

    def constant(self, var, value):
        """``value`` of ``var`` as the cut reads it: the weights and the bias cut, others whole."""
        if var is self.site.weight:
            return take(value, self.keep, self.site.weight_axes[self.axis])
        if var is self.site.bias:
            return self.vector(value)
        return value

    def shape(self, var, shape: tuple) -> tuple:
        """The shape an input ``var`` is drawn at (traced weights or bias are cut too)."""
        axis = self.site.weight_axes[self.axis] if var is self.site.weight else \
            self.axis if var is self.site.bias else None
        if axis is None or shape[axis] != self.size:
            return shape
        return shape[:axis] + (len(self.keep),) + shape[axis + 1:]

    def describe(self) -> str:
        drawn = len(self.keep) - 2 * EDGES
        return (f"{len(self.keep)} of its {self.size} output features (the first {EDGES}, the "
                f"last {EDGES} and {drawn} drawn with seed {self.size}), the constants it ships "
                f"at all {self.size} ({len(windows(self))} cuts of {window(self)})")

    def span(self) -> str:
        """The kept features as a range, for a window (:func:`windows`)."""
        return f"output features {int(self.keep[0])}-{int(self.keep[-1])} of {self.size}"


def keep(size: int, count: int = KEEP) -> np.ndarray:
    """``count`` of ``size`` feature indices: both ends and a sample seeded by ``size`` (the same
    cut for the same site, so a refusal reproduces)."""
    ends = np.r_[0:EDGES, size - EDGES:size]
    middle = np.random.default_rng(size).choice(np.arange(EDGES, size - EDGES),
                                                count - 2 * EDGES, replace=False)
    return np.unique(np.concatenate([ends, middle]))


def choose(site: Site | None) -> Cut | None:
    """The cut a region with ``site`` is validated on, or None (no site, small weights, or no
    feature axis longer than ``KEEP`` that may be cut)."""
    if site is None or aval_bytes(site.weight.aval) < CUT_ABOVE:
        return None
    axes = [j for j in site.cuttable if site.sizes[j] > KEEP]
    if not axes:
        return None
    j = max(axes, key=lambda a: site.sizes[a])
    return Cut(site, j, keep(site.sizes[j]), site.sizes[j])


def window(cut: Cut) -> int:
    """How many features each cut of the coverage check holds: at most as many as
    ``WINDOW_BYTES`` of the site's weights hold (fewer cuts, fewer traces; few bytes at a time)
    and half of them (every cut is a cut), spread evenly over that many cuts (the last overlaps
    the one before by less than a cut's count of features), at least ``KEEP``."""
    per_feature = max(1, aval_bytes(cut.site.weight.aval) // cut.size)
    most = max(1, min(cut.size // 2, WINDOW_BYTES // per_feature))
    cuts = -(-cut.size // most)
    return int(max(KEEP, -(-cut.size // cuts)))


def windows(cut: Cut) -> list:
    """Consecutive cuts of :func:`window` features along ``cut``'s axis covering all of it (the
    last one ends at the last feature, overlapping the one before: every cut is as long, so a
    cut axis never has the length 1 that broadcasts)."""
    n = window(cut)
    starts = list(range(0, cut.size - n, n)) + [cut.size - n]
    return [Cut(cut.site, cut.axis, np.arange(a, a + n), cut.size) for a in starts]


# ---- every feature of what the rewrite ships -----------------------------------------------

class Mismatch(Exception):
    """The replacement traced on a cut is not the whole one's restricted to it (not a value:
    the equations, their params or its outputs differ otherwise than in the features' length)."""


class TracedValue:
    """A value the replacement computed from its inputs, while it is traced for its constants
    (:func:`coverage`): a JAX tracer that ``Emit`` hands back to the rule as it is (it returns
    what it binds as NumPy arrays, and a bare tracer would be converted); arithmetic, attributes
    and methods are the tracer's. NumPy defers to it (``__array_ufunc__ = None``), so a NumPy
    constant on the left of an operator is the tracer's operand too."""

    __slots__ = ("t",)
    __array_ufunc__ = None

    def __init__(self, t):
        self.t = t

    def __getattr__(self, name):  # shape, dtype, ndim, astype, reshape, T, ...
        got = getattr(self.t, name)
        if not callable(got):
            return wrap(got)
        return lambda *a, **k: wrap(got(*map(unwrap, a), **{n: unwrap(x) for n, x in k.items()}))

    def __getitem__(self, index):
        return wrap(self.t[index])


def _operator(name: str):
    def op(self, *others):
        return wrap(getattr(self.t, name)(*map(unwrap, others)))
    op.__name__ = name
    return op


for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
              "xor", "lshift", "rshift"):
    for _form in (f"__{_name}__", f"__r{_name}__"):
        setattr(TracedValue, _form, _operator(_form))
for _form in ("__neg__", "__pos__", "__abs__", "__invert__", "__lt__", "__le__", "__gt__",
              "__ge__"):
    setattr(TracedValue, _form, _operator(_form))


def wrap(x):
    return TracedValue(x) if isinstance(x, Tracer) else x


def unwrap(x):
    return x.t if isinstance(x, TracedValue) else x


def bind_traced(eqn, args, widen: bool = False) -> list | None:
    """``eqn`` bound on ``args`` while a replacement is traced (:func:`coverage`) or a region
    and its replacement are (``passes/validate_compiled.py``), its outputs wrapped
    (:class:`TracedValue`); ``widen``: in float64, as the eager evaluation widens it
    (``ir.widen``); None when nothing is traced here."""
    if not _TRACING.get() or not any(isinstance(a, (TracedValue, Tracer)) for a in args):
        return None
    args = [unwrap(a) for a in args]
    if not widen:
        return [wrap(o) for o in bind_equation(eqn, args)]
    from mlsys_jax.ir.evaluate import eval_equation
    from mlsys_jax.ir.widen import bind_widened_blocks, widen_value

    outs = bind_widened_blocks(eqn, args)
    if outs is None:
        outs = eval_equation(eqn, [widen_value(a) for a in args], True)
    return [wrap(o) for o in outs]


def traced() -> bool:
    """Whether a replacement or region is being traced here (:func:`tracing`)."""
    return bool(_TRACING.get())


def tracing():
    """Inside, :func:`bind_traced` binds equations on tracers (the replacement or region traced)."""
    return setting(_TRACING, True)


def _trace(region, replacement, cut: Cut | None):
    """The replacement as a jaxpr, in the program's dtypes: whole (``cut`` None) or on ``cut``."""
    def shape(v):
        s = tuple(v.aval.shape)
        return s if cut is None else cut.shape(v, s)
    args = [jax.ShapeDtypeStruct(shape(v), v.aval.dtype, weak_type=v.aval.weak_type)
            for v in region.inputs]

    def fn(*vals):
        read = dict(zip(region.inputs, vals)).__getitem__
        outs = replacement(read, False) if cut is None else replacement(read, False, cut)
        return [unwrap(outs[v]) for v in region.outputs]
    with tracing():
        return jax.make_jaxpr(fn)(*args)


def _bound(jaxpr, consts, known: list) -> list:
    """``(primitive, params, operands)`` of every equation, calls inlined, bodies after their
    equation: an operand is its value where it is a constant or literal, else None."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update((v, x) for v, x in zip(jaxpr.invars, known) if x is not None)
    out = []
    for e in jaxpr.eqns:
        vals = [v.val if type(v) is Literal else env.get(v) for v in e.invars]
        inner = bodies(e)
        if e.primitive.name in TRANSPARENT_CALLS and len(inner) == 1:
            out += _bound(inner[0].jaxpr, inner[0].consts, vals)
            continue
        held = {b.param for b in inner}  # bodies are compared equation by equation, below
        out.append((e.primitive.name, {k: x for k, x in e.params.items() if k not in held},
                    vals))
        for b in inner:
            out += _bound(b.jaxpr, b.consts, [None] * len(b.jaxpr.invars))
    return out


def _lengths_agree(whole, part, cut: Cut) -> bool:
    """Two shapes (or int tuples) the same but where the whole one's ``cut.size`` is the cut's
    length."""
    return len(whole) == len(part) and all(
        a == b or (a == cut.size and b == len(cut.keep)) for a, b in zip(whole, part))


def _same_params(p: dict, q: dict, cut: Cut) -> bool:
    if p.keys() != q.keys():
        return False
    for k in p:
        a, b = p[k], q[k]
        ints = all(isinstance(t, tuple) and all(isinstance(i, int) for i in t) for t in (a, b))
        if not (_lengths_agree(a, b, cut) if ints else a is b or bool(a == b)):
            return False
    return True


def _bits(x: np.ndarray) -> np.ndarray:
    size = x.dtype.itemsize
    return x.view(f"u{size}") if size in (1, 2, 4, 8) and x.dtype != np.bool_ else x


def _differs(whole, part, cut: Cut, what: str) -> str | None:
    """Why constant ``part`` (bound on ``cut``) is not ``whole`` at the cut's features, or None."""
    w, c = np.asarray(whole), np.asarray(part)
    if w.dtype != c.dtype or not _lengths_agree(w.shape, c.shape, cut):
        raise Mismatch(f"{what}: {w.dtype}{list(w.shape)} whole, {c.dtype}{list(c.shape)} on "
                       "the cut")
    axes = [a for a, (m, n) in enumerate(zip(w.shape, c.shape)) if m != n]
    for a in axes:
        w = take(w, cut.keep, a)
    bad = _bits(w) != _bits(c)
    if not bad.any():
        return None
    features = np.unique(cut.keep[np.argwhere(bad)[:, axes].ravel()]).tolist() if axes else []
    diff = f", max relative difference {_relative(w, c, bad):.3g}" if is_float(w.dtype) else ""
    where = f" at feature(s) {', '.join(map(str, features[:5]))}" if features else ""
    return (f"{what} differs from the rule's own on a cut ({cut.span()}){where}: "
            f"{int(bad.sum())} of {c.size} values{diff}")


def _relative(w, c, bad) -> float:
    """The largest relative difference of the differing values (Inf where the whole one is 0)."""
    a, b = w[bad].astype(np.float64), c[bad].astype(np.float64)
    ok = np.isfinite(a) & np.isfinite(b)
    if not ok.any():
        return float("inf")
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.max(np.abs(a[ok] - b[ok]) / np.abs(a[ok])))


def _compare(whole: list, part: list, cut: Cut) -> str | None:
    """The first constant ``part`` binds otherwise than ``whole`` at ``cut``'s features, or None;
    :class:`Mismatch` where the equations differ otherwise."""
    if [e[0] for e in whole] != [e[0] for e in part]:
        raise Mismatch(f"other equations on {cut.span()} than whole")
    for i, ((prim, p, xs), (_, q, ys)) in enumerate(zip(whole, part)):
        if len(xs) != len(ys) or not _same_params(p, q, cut):
            raise Mismatch(f"equation {i} ({prim}) is bound otherwise on {cut.span()}")
        for k, (x, y) in enumerate(zip(xs, ys)):
            if (x is None) != (y is None):
                raise Mismatch(f"operand {k} of equation {i} ({prim}) is a constant on one side")
            if x is not None:
                why = _differs(x, y, cut, f"the constant {_name(x)} (operand {k} of {prim})")
                if why:
                    return why
    return None


def _name(x) -> str:
    x = np.asarray(x)
    return f"{x.dtype}{list(x.shape)}"


def coverage(region, replacement, cut: Cut) -> str | None:
    """None if every constant the replacement binds whole — what the rewrite ships — is, at
    every output feature, what it binds on the cut (:func:`windows`) holding it (see the
    module doc); else the first difference. Raises :class:`Mismatch` (or the error tracing
    raised) where the replacement cannot be compared so: the region is then validated whole."""
    whole_jaxpr = _trace(region, replacement, None)
    whole = _bound(whole_jaxpr.jaxpr, whole_jaxpr.consts, [None] * len(region.inputs))
    outs = [tuple(a.shape) for a in whole_jaxpr.out_avals]
    for w in windows(cut):
        part_jaxpr = _trace(region, replacement, w)
        if not all(_lengths_agree(o, tuple(a.shape), w)
                   for o, a in zip(outs, part_jaxpr.out_avals)):
            raise Mismatch(f"the replacement's outputs on {w.span()} are not its whole ones cut")
        why = _compare(whole, _bound(part_jaxpr.jaxpr, part_jaxpr.consts,
                                     [None] * len(region.inputs)), w)
        if why:
            return why
    return None
