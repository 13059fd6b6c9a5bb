"""What the conv rewrites see: constants, conv sites (a conv, or a named ``conv_bias`` call), users.

A *site* is a convolution whose output we may replace: a ``conv_general_dilated`` equation, or a
named call whose body is exactly ``conv(x, w) + broadcast(b)`` (what ``fold_conv_bn`` emits and
``models.conv_bias`` is), so the rules compose: fold, then enlarge, then merge (§4.2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from jax import lax

from mlsys_jax.compat import ClosedJaxpr, Literal, Var, bind_equation
from mlsys_jax.ir.opview import consumers
from mlsys_jax.ir.primitives import JIT
from mlsys_jax.passes.core import is_pure

CONV = "conv_general_dilated"
EVAL_MAX_ELEMENTS = 1 << 24  # never materialise a constant bigger than this for analysis


class Consts:
    """Lazy constant propagation over one jaxpr level: the value of a var computed only from
    consts and literals by pure equations (evaluated with JAX, eagerly), else None."""

    def __init__(self, jaxpr, consts, known: dict | None = None, nested: bool = False):
        self.nested = nested  # a body inside a call: its inputs are the call's arguments
        self.producer = {v: e for e in jaxpr.eqns for v in e.outvars}
        self.memo = dict(zip(jaxpr.constvars, consts))
        self.memo.update(known or {})
        self.invars = set(jaxpr.invars)

    def value(self, v):
        if isinstance(v, Literal):
            return jnp.asarray(v.val, dtype=v.aval.dtype)
        if v in self.memo:
            return self.memo[v]
        out = None
        eqn = self.producer.get(v)
        if (eqn is not None and is_pure(eqn) and v not in self.invars
                and all(math.prod(o.aval.shape) <= EVAL_MAX_ELEMENTS for o in eqn.outvars)):
            ins = [self.value(x) for x in eqn.invars]
            if all(x is not None for x in ins):
                with jax.ensure_compile_time_eval():
                    outs = bind_equation(eqn, ins)
                self.memo.update(zip(eqn.outvars, outs))
                return self.memo[v]
        self.memo[v] = out
        return out

    def depends_on(self, v, target, _seen=None) -> bool:
        """Whether ``v`` is computed (transitively) from ``target``."""
        seen = set() if _seen is None else _seen
        stack = [v]
        while stack:
            u = stack.pop()
            if u is target:
                return True
            if isinstance(u, Literal) or u in seen:
                continue
            seen.add(u)
            e = self.producer.get(u)
            if e is not None:
                stack.extend(x for x in e.invars if isinstance(x, Var))
        return False


@dataclass(frozen=True)
class Site:
    """A conv we may rewrite: the equation, its index, input, weight, optional bias, output."""

    index: int
    eqn: object        # the top-level equation (a conv or a conv_bias call)
    conv: object       # the conv equation itself (for its params)
    x: object
    w: object
    b: object          # a var/literal, or None
    out: object

    @property
    def params(self) -> dict:
        return self.conv.params

    @property
    def dims(self):
        return self.conv.params["dimension_numbers"]

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


def conv_bias_body(body):
    """If ``body`` (a ClosedJaxpr, or an open jaxpr) is conv(in0, in1) + broadcast(in2) with one
    output, return its conv equation."""
    j = getattr(body, "jaxpr", body)
    if len(j.invars) != 3 or len(j.outvars) != 1 or getattr(body, "consts", ()):
        return None
    convs = [e for e in j.eqns if e.primitive.name == CONV]
    if len(convs) != 1 or list(convs[0].invars) != list(j.invars[:2]):
        return None
    last = j.eqns[-1]
    if last.primitive.name != "add" or last.outvars[0] is not j.outvars[0]:
        return None
    z = convs[0].outvars[0]
    other = [v for v in last.invars if v is not z]
    if len(other) != 1 or z not in last.invars:
        return None
    rest = [e for e in j.eqns if e is not convs[0] and e is not last]
    if not all(e.primitive.name in ("broadcast_in_dim", "reshape") and len(e.invars) == 1
               for e in rest):
        return None
    chain_in = {e.outvars[0]: e.invars[0] for e in rest}
    v = other[0]
    while v in chain_in:
        v = chain_in[v]
    if v is not j.invars[2]:
        return None
    fd = convs[0].params["dimension_numbers"].out_spec[1]
    if j.invars[2].aval.shape != (z.aval.shape[fd],):
        return None
    return convs[0]


def find_sites(jaxpr) -> list[Site]:
    """Every conv site at this level, in program order."""
    sites = []
    for i, e in enumerate(jaxpr.eqns):
        if e.primitive.name == CONV and len(e.invars) == 2:
            sites.append(Site(i, e, e, e.invars[0], e.invars[1], None, e.outvars[0]))
        elif e.primitive.name in JIT and isinstance(e.params.get("jaxpr"), ClosedJaxpr):
            conv = conv_bias_body(e.params["jaxpr"])
            if conv is not None:
                sites.append(Site(i, e, conv, e.invars[0], e.invars[1], e.invars[2], e.outvars[0]))
    return sites


def users_of(jaxpr) -> dict:
    return consumers(jaxpr)


def broadcast_channel(vec, ndim: int, dim: int):
    """A (C,) vector shaped to broadcast along axis ``dim`` of an ``ndim``-D tensor."""
    return lax.broadcast_in_dim(vec, tuple(vec.shape[0] if d == dim else 1 for d in range(ndim)),
                                (dim,))


def emit_conv(site: Site, x, w, b=None, **param_overrides):
    """The conv of ``site`` on new weights (and params), plus a bias as one named op ``conv_bias``
    (like models.conv_bias, generalised to the conv's own layout, strides, padding, groups)."""
    params = dict(site.params, **param_overrides)
    conv = site.conv

    def conv_only(x, w):
        return bind_equation(conv.replace(params=params), [x, w])[0]

    if b is None:
        return conv_only(x, w)

    def conv_bias(x, w, b):
        z = conv_only(x, w)
        return z + broadcast_channel(b.astype(z.dtype), z.ndim, site.feature_dim)

    return jax.jit(conv_bias)(x, w, b)


def attribute_difference(a: Site, b: Site, same_window: bool = True) -> str | None:
    """The first attribute in which two convs on the same input differ (None: mergeable)."""
    pa, pb = a.params, b.params
    if same_window and a.window != b.window:
        return (f"window size differs: {'×'.join(map(str, a.window))} vs "
                f"{'×'.join(map(str, b.window))}")
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


def fmt_window(site: Site) -> str:
    return "×".join(map(str, site.window))


def out_length(n: int, lo: int, hi: int, k: int, dilation: int, stride: int) -> int:
    """Output length of one spatial dim of a conv (lax.conv_general_dilated's rule)."""
    span = (k - 1) * dilation + 1
    return max(0, (n + lo + hi - span) // stride + 1)


def enlarge_padding(site: Site, target: tuple, partner: Site | None = None):
    """Where the old kernel sits inside the ``target`` window (its tap, per spatial dim) and the
    new padding, so that every output keeps its value for finite inputs; or the reason (a str).

    Alone, the kernel is centred (§4.2 step ③). Beside a ``partner`` (the conv it is enlarged to
    merge with) it takes the partner's padding: the tap ``t`` with ``lo + t·dilation`` equal to
    the partner's low padding reads exactly the inputs the old kernel read, and the high padding
    may be the partner's whenever the output length stays the same (a stride-2 conv never reads
    the last padded row) — so a ResNet downsample pair (3×3 stride 2 with SAME padding ((0,1),(0,1))
    beside a 1×1 stride-2 projection) can merge.
    """
    taps, padding = [], []
    for i, (k0, k) in enumerate(zip(site.window, target)):
        grow = k - k0
        r, st = site.params["rhs_dilation"][i], site.params["window_strides"][i]
        lo, hi = site.params["padding"][i]
        n = site.x.aval.shape[site.dims.lhs_spec[2 + i]]
        if partner is None:
            if grow % 2:
                return "the size difference must be even to keep the kernel centred"
            t = grow // 2
            new = (lo + r * t, hi + r * (grow - t))
        else:
            new = tuple(partner.params["padding"][i])
            t, rem = divmod(new[0] - lo, r)
            if rem or not 0 <= t <= grow:
                return (f"conv {partner.index}'s padding {tuple(map(tuple, partner.params['padding']))} "
                        f"would need the {fmt_window(site)} kernel at offset {(new[0] - lo) / r:g} "
                        f"of spatial dim {i}, outside the {k}-wide window; no tap keeps the result")
            if out_length(n, *new, k, r, st) != out_length(n, lo, hi, k0, r, st):
                return (f"with conv {partner.index}'s padding {new} on spatial dim {i} the output "
                        f"would have {out_length(n, *new, k, r, st)} positions instead of "
                        f"{out_length(n, lo, hi, k0, r, st)}")
        taps.append(t)
        padding.append(new)
    return tuple(taps), tuple(padding)
