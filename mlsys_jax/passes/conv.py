"""The lecture's conv rewrites (§4.1, §4.2): fold_conv_bn, merge_parallel_convs, enlarge_conv_kernel.

Each analyses one jaxpr level, decides where it fires (or why it refuses), then re-traces with a
handler that emits the replacement with ordinary JAX code; orphaned equations are removed by DCE.
``only=k`` applies just the k-th top-level candidate (the search's moves); ``candidates(closed)``
counts them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import Literal, Var
from mlsys_jax.ir.opview import op_name
from mlsys_jax.passes.affine import Refuse, affine_chain
from mlsys_jax.passes.basic import dce_jaxpr
from mlsys_jax.ir.walk import walk
from mlsys_jax.passes.convsites import (CONV, Consts, Site, attribute_difference,
                                        emit_conv, find_sites, users_of)
from mlsys_jax.passes.core import Log, Pass, PassResult, is_concrete, transform


def _fmt_window(site: Site) -> str:
    return "×".join(map(str, site.window))


def _conv_pass(name: str, plan_fn, only=None, **options) -> Pass:
    """A pass from ``plan_fn(jaxpr, consts, log, path, **options) -> {eqn index: emit(lookup)}``."""
    def make_rule(closed, log, path):
        top = path == ""
        if only is not None and not top:
            return None
        plans = plan_fn(closed.jaxpr, closed.consts, log, path, **options)
        if only is not None:
            firsts = sorted({p.first for p in plans.values()})
            keep = firsts[only] if only < len(firsts) else None
            plans = {i: p for i, p in plans.items() if p.first == keep}
        state: dict = {}

        def rule(i, eqn, invals, lookup, here):
            plan = plans.get(i)
            if plan is None:
                return None
            outs = plan.emit(lookup, state)
            if plan.first == i:
                log.fired(here, plan.detail)
            return outs
        return rule

    def fn(closed):
        log = Log(name)
        if not any(e.primitive.name == CONV for _, e in walk(closed)):
            return PassResult(closed, False)  # nothing to match: skip the re-trace
        new = transform(closed, make_rule, log, recurse=only is None)
        if new is not closed:
            new = dce_jaxpr(new)
        return PassResult(new, new is not closed, tuple(log.rewrites), tuple(log.refusals))
    return Pass(name if only is None else f"{name}@{only}", fn)


class Plan:
    """Outputs for one equation; ``first`` groups the equations of one rewrite (for ``only``)."""

    def __init__(self, first: int, detail: str, emit):
        self.first, self.detail, self.emit = first, detail, emit


def _value(lookup, consts: Consts, v):
    val = consts.value(v) if not isinstance(v, Literal) else v.val
    return val if val is not None else lookup(v)


def _np(x):
    """A known value as NumPy (None stays None); traced values are returned as they are."""
    return x if x is None or not is_concrete(x) else np.asarray(x)


def _channel_scale(w, vec, site: Site):
    """W · s along the kernel's output-feature axis (known W: exact in float64, rounded once)."""
    shape = [1] * w.ndim
    shape[site.dims.rhs_spec[0]] = -1
    if is_concrete(w):
        return (np.asarray(w, np.float64) * vec.reshape(shape)).astype(np.asarray(w).dtype)
    return w * jnp.asarray(vec.reshape(shape), w.dtype)


# ---- fold_conv_bn ----------------------------------------------------------------------------

def _fold_plans(jaxpr, consts, log, path):
    c = Consts(jaxpr, consts)
    users = users_of(jaxpr)
    plans = {}
    for site in find_sites(jaxpr):
        try:
            found = affine_chain(jaxpr, c, site, users)
        except Refuse as e:
            log.refused(f"{path}{site.index}", str(e))
            continue
        if found is None:
            continue
        aff, end = found

        def emit(lookup, state, site=site, aff=aff):
            # §4.1: W·s and B' = (B − μ)·s + β depend only on constants: computed here, once.
            new_w = _channel_scale(_value(lookup, c, site.w), aff.a, site)
            b0 = None if site.b is None else _value(lookup, c, site.b)
            dtype = site.out.aval.dtype
            if b0 is None:
                new_b = aff.b.astype(dtype)
            elif is_concrete(b0):
                new_b = (np.asarray(b0, np.float64) * aff.a + aff.b).astype(dtype)
            else:
                new_b = b0 * jnp.asarray(aff.a, dtype) + jnp.asarray(aff.b, dtype)
            return [emit_conv(site, lookup(site.x), new_w, new_b)]
        plans[end] = Plan(end, f"folded {aff.steps} per-channel affine op(s) into conv at "
                               f"{path}{site.index}", emit)
    return plans


def fold_conv_bn(only: int | None = None) -> Pass:
    """Fold inference-mode BatchNorm — any per-output-channel ``s * conv(x, W) + t`` with constant
    s, t — into the conv's weights and a bias: one named op ``conv_bias`` (§4.1 rule 1).

    Recognises the named ``batch_norm`` call and inline forms, any layout, strides, padding,
    dilation and groups. Training-mode BN (statistics from the batch) is refused with the reason.
    """
    return _conv_pass("fold_conv_bn", _fold_plans, only)


# ---- merge_parallel_convs --------------------------------------------------------------------

def _available(site: Site, c: Consts, before: int, defined: dict) -> bool:
    vs = [site.w] + ([site.b] if site.b is not None else [])
    return all(isinstance(v, Literal) or c.value(v) is not None or defined.get(v, -1) < before
               for v in vs)


def _merge_plans(jaxpr, consts, log, path, concat=True):
    c = Consts(jaxpr, consts)
    users = users_of(jaxpr)
    sites = find_sites(jaxpr)
    by_out = {s.out: s for s in sites}
    producer = {v: e for e in jaxpr.eqns for v in e.outvars} if sites else {}
    plans, used = {}, set()
    for i, e in enumerate(jaxpr.eqns):  # §4.1 rule (2): Conv(X,W1) + Conv(X,W2) = Conv(X,W1+W2)
        if e.primitive.name not in ("add", "add_any") or len(e.invars) != 2:
            continue
        a, b = (by_out.get(v) if isinstance(v, Var) else None for v in e.invars)
        if a is None or b is None:
            if by_out:
                _explain_nonlinear(producer, e, i, by_out, log, path)
            continue
        if a is b or a.x is not b.x or a.index in used or b.index in used:
            continue
        diff = attribute_difference(a, b)
        if diff is None and a.out.aval != b.out.aval:
            diff = f"output types differ: {a.out.aval.str_short()} vs {b.out.aval.str_short()}"
        if diff is None and (users.get(a.out) != [i] or users.get(b.out) != [i]):
            diff = "a conv output is also used elsewhere"
        if diff is not None:
            log.refused(f"{path}{i}", f"cannot merge convs {a.index} and {b.index}: {diff}")
            continue
        used |= {a.index, b.index}

        def emit(lookup, state, a=a, b=b):
            wa, wb = _np(_value(lookup, c, a.w)), _np(_value(lookup, c, b.w))
            ba = None if a.b is None else _np(_value(lookup, c, a.b))
            bb = None if b.b is None else _np(_value(lookup, c, b.b))
            w = wa + wb
            bias = ba if bb is None else (bb if ba is None else ba + bb)
            return [emit_conv(a, lookup(a.x), w, bias)]
        plans[i] = Plan(i, f"merged convs {path}{a.index} + {path}{b.index} "
                           f"({_fmt_window(a)}); the add disappears", emit)
    if concat:
        _concat_plans(jaxpr, c, sites, used, plans, path)
    return plans


def _explain_nonlinear(producer, add, i, by_out, log, path):
    """Refuse rule (2) loudly when a nonlinear op sits between parallel convs and their add."""
    found = []
    for v in add.invars:
        site = by_out.get(v) if isinstance(v, Var) else None
        op = None
        if site is None and isinstance(v, Var) and v in producer:
            e = producer[v]
            ins = [x for x in e.invars if isinstance(x, Var)]
            if len(ins) == 1 and ins[0] in by_out:
                site, op = by_out[ins[0]], op_name(e)
        found.append((site, op))
    (sa, oa), (sb, ob) = found
    if sa is not None and sb is not None and sa.x is sb.x and (oa or ob):
        log.refused(f"{path}{i}", f"cannot merge convs {sa.index} and {sb.index}: a nonlinear op "
                    f"({oa or ob}) sits between a conv and the add; rule (2) needs the conv "
                    "outputs summed directly")


def _concat_plans(jaxpr, c, sites, used, plans, path):
    """Independently used convs on one input: one conv with concatenated output channels, then
    slices (like TASO's merge of parallel convs)."""
    defined = {v: k for k, e in enumerate(jaxpr.eqns) for v in e.outvars}
    free = [s for s in sites if s.index not in used]
    for n, a in enumerate(free):
        for b in free[n + 1:]:
            if a.index in used or b.index in used or a.x is not b.x:
                continue
            if attribute_difference(a, b) is not None or not _available(b, c, a.index, defined):
                continue
            if a.params["feature_group_count"] != 1 or a.params["batch_group_count"] != 1:
                continue  # with groups, output channels belong to input groups: no plain concat
            used |= {a.index, b.index}
            oa = a.out_features

            def emit_first(lookup, state, a=a, b=b, oa=oa):
                ws = [_np(_value(lookup, c, s.w)) for s in (a, b)]
                bs = [None if s.b is None else _np(_value(lookup, c, s.b)) for s in (a, b)]
                xp = np if all(map(is_concrete, ws + bs)) else jnp
                w = xp.concatenate(ws, axis=a.dims.rhs_spec[0])
                bias = None
                if any(x is not None for x in bs):
                    bias = xp.concatenate([x if x is not None else np.zeros(
                        (s.out_features,), s.out.aval.dtype) for x, s in zip(bs, (a, b))])
                z = emit_conv(a, lookup(a.x), w, bias)
                fd = a.feature_dim
                state[b.index] = lax.slice_in_dim(z, oa, z.shape[fd], axis=fd)
                return [lax.slice_in_dim(z, 0, oa, axis=fd)]

            plans[a.index] = Plan(a.index, f"merged convs {path}{a.index} ∥ {path}{b.index} by "
                                           "concatenating output channels", emit_first)
            plans[b.index] = Plan(a.index, "", lambda lookup, state, b=b: [state[b.index]])


def merge_parallel_convs(concat: bool = True, only: int | None = None) -> Pass:
    """Merge convs on the same input with identical window, strides, padding, dilation, groups,
    precision and dtypes: summed outputs → one conv with summed weights (§4.1 rule 2); with
    ``concat``, independently used outputs → one conv with concatenated channels plus slices.
    A refusal names the attribute that differs."""
    return _conv_pass("merge_parallel_convs", _merge_plans, only, concat=concat)


# ---- enlarge_conv_kernel ---------------------------------------------------------------------

def _enlarge_plans(jaxpr, consts, log, path, size=None):
    c = Consts(jaxpr, consts)
    sites = find_sites(jaxpr)
    plans = {}
    for s in sites:
        if size is not None:
            target = (size,) * len(s.window)
        else:  # §4.2 step ③: grow to a parallel conv's window on the same input
            bigger = [o.window for o in sites if o is not s and o.x is s.x
                      and attribute_difference(s, o, same_window=False) is None
                      and o.window != s.window and all(k >= j for k, j in zip(o.window, s.window))]
            if not bigger:
                continue
            target = bigger[0]
        grow = [k - j for k, j in zip(target, s.window)]
        if all(g == 0 for g in grow) or any(g < 0 for g in grow):
            continue
        if any(g % 2 for g in grow):
            log.refused(f"{path}{s.index}", f"cannot enlarge {_fmt_window(s)} to "
                        f"{'×'.join(map(str, target))}: the size difference must be even to keep "
                        "the kernel centred")
            continue
        if any(d != 1 for d in s.params["lhs_dilation"]):
            log.refused(f"{path}{s.index}", "cannot enlarge a conv with lhs (input) dilation")
            continue

        def emit(lookup, state, s=s, grow=grow):
            w = _np(_value(lookup, c, s.w))
            pads = [(0, 0)] * w.ndim
            for d, g in zip(s.dims.rhs_spec[2:], grow):
                pads[d] = (g // 2, g // 2)  # the old kernel centred, zeros around it
            padding = tuple((lo + r * g // 2, hi + r * g // 2) for (lo, hi), r, g in
                            zip(s.params["padding"], s.params["rhs_dilation"], grow))
            new_w = (np if is_concrete(w) else jnp).pad(w, pads)
            b = None if s.b is None else _value(lookup, c, s.b)
            return [emit_conv(s, lookup(s.x), new_w, b, padding=padding)]
        plans[s.index] = Plan(s.index, f"enlarged {_fmt_window(s)} → {'×'.join(map(str, target))} "
                                       "(zero-padded kernel, padding adjusted)", emit)
    return plans


def enlarge_conv_kernel(size: int | None = None, only: int | None = None) -> Pass:
    """Grow a conv's kernel by zero-padding it (centred) and widening its padding so the output
    keeps its shape and value (§4.2 step ③, "worse before better"). Default: grow to the window
    of a parallel conv on the same input; ``size=k``: grow every smaller kernel to k×k.
    Needs a finite input (0·Inf = NaN in the new taps)."""
    return _conv_pass("enlarge_conv_kernel", _enlarge_plans, only, size=size)


def candidates(rule_factory, closed) -> int:
    """How many top-level rewrites ``rule_factory`` could apply to ``closed`` (search moves)."""
    plan_fn = {fold_conv_bn: _fold_plans, merge_parallel_convs: _merge_plans,
               enlarge_conv_kernel: _enlarge_plans}[rule_factory]
    with jax.ensure_compile_time_eval():
        plans = plan_fn(closed.jaxpr, closed.consts, Log("count"), "")
    return len({p.first for p in plans.values()})
