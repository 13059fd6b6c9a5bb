"""The lecture's conv rewrites (§4.1, §4.2): fold_conv_bn, merge_parallel_convs, enlarge_conv_kernel.

Each analyses one jaxpr level, decides where it fires (or why it refuses: a matched anchor that
does not fire is always reported, never silent), then re-traces with a handler that emits the
replacement with ordinary JAX code (``passes/convpass.py``). ``only=k`` applies just the k-th
top-level candidate (the search's moves); ``candidates(closed)`` counts them.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import Literal, Var, bind_equation
from mlsys_jax.ir.opview import op_name
from mlsys_jax.passes.bnchain import affine_chain
from mlsys_jax.passes.convpass import (Plan, as_numpy as _np, conv_pass, levels,
                                       value_of as _value)
from mlsys_jax.passes.convsites import (Consts, Site, attribute_difference, conv_bias_body,
                                        emit_conv, enlarge_padding, find_sites, fmt_window,
                                        users_of)
from mlsys_jax.passes.core import Log, Pass, is_concrete


_SCALE_BLOCK_BYTES = 1 << 26  # a known W is scaled this many of its bytes at a time


def _channel_scale(w, vec, site: Site):
    """W · s along the kernel's output-feature axis (known W: exact in float64 or int64, rounded
    once, a block of output channels at a time: a whole float64 copy of a large kernel would
    take twice its size again)."""
    axis = site.dims.rhs_spec[0]
    shape = [1] * w.ndim
    shape[axis] = -1
    if not is_concrete(w):
        return w * jnp.asarray(vec.reshape(shape).astype(w.dtype))
    w = np.asarray(w)
    out = np.empty(w.shape, w.dtype)
    step = max(1, w.shape[axis] * _SCALE_BLOCK_BYTES // max(w.nbytes, 1))
    for start in range(0, w.shape[axis], step):
        block = [slice(None)] * w.ndim
        block[axis] = slice(start, start + step)
        part = vec.reshape(-1)[start:start + step].reshape(shape)
        out[tuple(block)] = w[tuple(block)].astype(vec.dtype) * part
    return out


# ---- fold_conv_bn ----------------------------------------------------------------------------

def _fold_plans(jaxpr, consts, log, path):
    if path and conv_bias_body(jaxpr) is not None:
        return {}  # inside a conv_bias op: already folded, its bias is the call's argument
    c = Consts(jaxpr, consts, nested=bool(path))
    users = users_of(jaxpr)
    plans = {}
    for site in find_sites(jaxpr):
        chain = affine_chain(jaxpr, c, site, users)
        if chain.refusal:
            log.refused(f"{path}{site.index}", chain.refusal)
        if chain.end is None:
            continue

        def emit(lookup, state, site=site, chain=chain):
            # §4.1: W·s and B' = (B − μ)·s + β depend only on constants: computed here, once.
            aff = chain.aff
            new_w = _channel_scale(_value(lookup, c, site.w), aff.a, site)
            b0 = None if site.b is None else _value(lookup, c, site.b)
            dtype = np.dtype(site.out.aval.dtype)
            if b0 is None:
                new_b = aff.b.astype(dtype)
            elif is_concrete(b0):
                new_b = (np.asarray(b0).astype(aff.b.dtype) * aff.a + aff.b).astype(dtype)
            else:
                new_b = b0 * jnp.asarray(aff.a.astype(dtype)) + jnp.asarray(aff.b.astype(dtype))
            out = emit_conv(site, lookup(site.x), new_w, new_b)
            for move in chain.moves:  # the reshapes/squeezes that stood between conv and BN
                out = bind_equation(move, [out])[0]
            return [out]
        plans[chain.end] = Plan(chain.end, f"{chain.aff.describe()} into conv at "
                                           f"{path}{site.index}", emit)
    return plans


def fold_conv_bn(only: int | None = None) -> Pass:
    """Fold inference-mode BatchNorm — any per-output-channel ``s * conv(x, W) + t`` with constant
    s, t — into the conv's weights and a bias: one named op ``conv_bias`` (§4.1 rule 1).

    Recognises the named ``batch_norm`` call and inline forms (flax, equinox), any layout,
    strides, padding, dilation and groups, through reshapes/squeezes/transposes/broadcasts between
    conv and BN. A bias add alone is reported as a bias merge. Refused with the reason: training-
    mode BN (statistics from the batch, however written), integer division (not linear), a
    constant that is not per-channel, a conv output that other ops read too.
    """
    return conv_pass("fold_conv_bn", _fold_plans, only)


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
    plans, used, reported = {}, set(), set()
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
            reported.add(frozenset((a.index, b.index)))
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
                           f"({fmt_window(a)}); the add disappears (exact for finite inputs)",
                        emit)
    if concat:
        _concat_plans(jaxpr, c, sites, used, reported, plans, log, path)
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


def _concat_plans(jaxpr, c, sites, used, reported, plans, log, path):
    """Independently used convs on one input: one conv with concatenated output channels, then
    slices (like TASO's merge of parallel convs). A pair that cannot merge is refused with the
    reason, once (``reported``: refused already as a summed pair)."""
    defined = {v: k for k, e in enumerate(jaxpr.eqns) for v in e.outvars}
    free = [s for s in sites if s.index not in used]
    for n, a in enumerate(free):
        for b in free[n + 1:]:
            if a.index in used or b.index in used or a.x is not b.x:
                continue
            diff = attribute_difference(a, b)
            if diff is None and not _available(b, c, a.index, defined):
                diff = f"conv {b.index}'s weights are computed after conv {a.index}"
            if diff is None and (a.params["feature_group_count"] != 1
                                 or a.params["batch_group_count"] != 1):
                # with groups, output channels belong to input groups: no plain concat
                diff = "grouped convs cannot be concatenated (channels belong to input groups)"
            if diff is not None:
                if frozenset((a.index, b.index)) not in reported:
                    log.refused(f"{path}{a.index}", f"cannot merge convs {a.index} and {b.index} "
                                                    f"(outputs used apart): {diff}")
                continue
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
    A refusal names the attribute that differs. The summed-weights merge is exact on finite
    inputs only, like §4.1 rule 2 itself: where an input is ±Inf, conv(x, W₁) + conv(x, W₂) is
    Inf − Inf = NaN wherever the two weights differ in sign, conv(x, W₁ + W₂) is ±Inf."""
    return conv_pass("merge_parallel_convs", _merge_plans, only, concat=concat)


# ---- enlarge_conv_kernel ---------------------------------------------------------------------

def _enlarge_target(s: Site, sites, log, where):
    """(target window, taps, padding) for ``s`` beside a larger parallel conv, or None (refusals
    logged: a smaller kernel beside a larger window is the rule's anchor)."""
    beside = [o for o in sites if o is not s and o.x is s.x and o.window != s.window
              and all(k >= j for k, j in zip(o.window, s.window))]
    reasons = []
    for o in beside:
        diff = attribute_difference(s, o, same_window=False)
        placed = enlarge_padding(s, o.window, o) if diff is None else diff
        if not isinstance(placed, str):
            return (o.window,) + placed
        reasons.append(f"beside conv {o.index} ({fmt_window(o)}): {placed}")
    if reasons:
        log.refused(where, f"cannot enlarge {fmt_window(s)} to merge it: {reasons[0]}")
    return None


def _enlarge_plans(jaxpr, consts, log, path, size=None):
    c = Consts(jaxpr, consts)
    sites = find_sites(jaxpr)
    plans = {}
    for s in sites:
        where = f"{path}{s.index}"
        if size is None:  # §4.2 step ③: grow to a parallel conv's window on the same input
            found = _enlarge_target(s, sites, log, where)
        elif s.window != (size,) * len(s.window) and all(k <= size for k in s.window):
            target = (size,) * len(s.window)
            placed = enlarge_padding(s, target)
            found = None if isinstance(placed, str) else (target,) + placed
            if found is None:
                log.refused(where, f"cannot enlarge {fmt_window(s)} to "
                                   f"{'×'.join(map(str, target))}: {placed}")
        else:
            found = None
        if found is None:
            continue
        if any(d != 1 for d in s.params["lhs_dilation"]):
            log.refused(where, "cannot enlarge a conv with lhs (input) dilation")
            continue
        target, taps, padding = found

        def emit(lookup, state, s=s, target=target, taps=taps, padding=padding):
            w = _np(_value(lookup, c, s.w))
            pads = [(0, 0)] * w.ndim
            for d, t, k0, k in zip(s.dims.rhs_spec[2:], taps, s.window, target):
                pads[d] = (t, k - k0 - t)  # the old kernel at tap t, zeros around it
            new_w = (np if is_concrete(w) else jnp).pad(w, pads)
            b = None if s.b is None else _value(lookup, c, s.b)
            return [emit_conv(s, lookup(s.x), new_w, b, padding=padding)]
        plans[s.index] = Plan(s.index, f"enlarged {fmt_window(s)} → {'×'.join(map(str, target))} "
                              f"(tap {taps}, padding {padding}); exact for finite inputs (an Inf "
                              "or NaN input gives NaN: 0·Inf)", emit)
    return plans


def enlarge_conv_kernel(size: int | None = None, only: int | None = None) -> Pass:
    """Grow a conv's kernel by zero-padding it and widening its padding so the output keeps its
    shape and value (§4.2 step ③, "worse before better"). Default: grow to the window of a
    parallel conv on the same input, placing the old kernel at the tap that gives the partner's
    padding (so the two can merge; refused with the reason where no tap does); ``size=k``: grow
    every smaller kernel to k×k, centred. Needs a finite input (0·Inf = NaN in the new taps):
    every rewrite's log line says so."""
    return conv_pass("enlarge_conv_kernel", _enlarge_plans, only, size=size)


_PLANS = {fold_conv_bn: _fold_plans, merge_parallel_convs: _merge_plans,
          enlarge_conv_kernel: _enlarge_plans}


def candidates(rule_factory, closed) -> int:
    """How many top-level rewrites ``rule_factory`` could apply to ``closed`` (search moves)."""
    with jax.ensure_compile_time_eval():
        plans = _PLANS[rule_factory](closed.jaxpr, closed.consts, Log("count"), "")
    return len({p.first for p in plans.values()})


def refusals(rule_factory, closed) -> tuple:
    """What ``rule_factory``'s pass would refuse in ``closed`` (every level), without re-tracing:
    what still refuses in a graph the search returns."""
    log = Log(rule_factory.__name__)
    with jax.ensure_compile_time_eval():
        for jaxpr, consts, path in levels(closed.jaxpr, closed.consts):
            _PLANS[rule_factory](jaxpr, consts, log, path)
    return tuple(log.refusals)
