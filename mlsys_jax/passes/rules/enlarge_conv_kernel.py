"""Rule: grow a conv's kernel by zero-padding it, keeping every output (§4.2 step ③).

"Worse before better": a 1×1 conv beside a 3×3 on the same input cannot merge; padded to 3×3 with
zeros (and its padding widened so the output keeps its shape and values) it can. Anchor: a conv
with a smaller window beside a larger one on the same input (default), or every smaller kernel
(``size=k``: grown to k×k, centred). Beside a partner the old kernel goes at the tap that gives
the partner's padding, so strided ResNet downsample pairs merge; refused with the reason where no
tap keeps the result. Exact for finite inputs only: a zero tap times an Inf input is NaN (0·Inf).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Tracer
from mlsys_jax.passes.core import Pass
from mlsys_jax.passes.rewrite.mutate import RuleMutant, during, proxy
from mlsys_jax.passes.rules import merge_parallel_convs
from mlsys_jax.passes.rewrite.linear import CONV, LinearSite, conv_difference, convs, emit_conv, \
    fmt_window
from mlsys_jax.passes.rewrite.rule import FINITE_ONLY, Match, Refused, Rule


@dataclass(frozen=True, kw_only=True)
class Enlarged(Match):
    site: LinearSite
    target: tuple
    taps: tuple
    padding: tuple


def out_length(n: int, lo: int, hi: int, k: int, dilation: int, stride: int) -> int:
    """Output length of one spatial dim of a conv (lax.conv_general_dilated's rule)."""
    span = (k - 1) * dilation + 1
    return max(0, (n + lo + hi - span) // stride + 1)


def enlarge_padding(site: LinearSite, target: tuple, partner: LinearSite | None = None):
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


def _beside(s: LinearSite, sites, level):
    """(target window, taps, padding) for ``s`` beside a larger parallel conv, or a Refused (a
    smaller kernel beside a larger window is the rule's anchor), or None."""
    others = [o for o in sites if o is not s and o.x is s.x and o.window != s.window
              and all(k >= j for k, j in zip(o.window, s.window))]
    reasons = []
    for o in others:
        diff = conv_difference(s, o, same_window=False)
        placed = enlarge_padding(s, o.window, o) if diff is None else diff
        if not isinstance(placed, str):
            return (o.window,) + placed
        reasons.append(f"beside conv {o.index} ({fmt_window(o)}): {placed}")
    if reasons:
        return Refused(s.index, "tap_keeps_result",
                       f"cannot enlarge {fmt_window(s)} to merge it: {reasons[0]}")
    return None


def match(level, size: int | None = None):
    sites = convs(level.jaxpr)
    for s in sites:
        if size is None:  # §4.2 step ③: grow to a parallel conv's window on the same input
            found = _beside(s, sites, level)
        elif s.window != (size,) * len(s.window) and all(k <= size for k in s.window):
            target = (size,) * len(s.window)
            placed = enlarge_padding(s, target)
            found = (target,) + placed if not isinstance(placed, str) else Refused(
                s.index, "tap_keeps_result",
                f"cannot enlarge {fmt_window(s)} to {'×'.join(map(str, target))}: {placed}")
        else:
            found = None
        if found is None or isinstance(found, Refused):
            if found is not None:
                yield found
            continue
        if any(d != 1 for d in s.params["lhs_dilation"]):
            yield Refused(s.index, "no_input_dilation", "cannot enlarge a conv with lhs (input) "
                          "dilation")
            continue
        target, taps, padding = found
        yield Enlarged(anchor=s.index, eqns=(s.index,), outputs=(s.out,),
                       detail=f"enlarged {fmt_window(s)} → {'×'.join(map(str, target))} (tap "
                              f"{taps}, padding {padding}); exact for finite inputs (an Inf or NaN "
                              "input gives NaN: 0·Inf)",
                       site=s, target=target, taps=taps, padding=padding)


def emit(m: Enlarged, em):
    s = m.site
    w = em.value(s.w)
    w = w if isinstance(w, Tracer) else np.asarray(w)
    pads = [(0, 0)] * w.ndim
    for d, t, k0, k in zip(s.dims.rhs_spec[2:], m.taps, s.window, m.target):
        pads[d] = (t, k - k0 - t)  # the old kernel at tap t, zeros around it
    new_w = (jnp if isinstance(w, Tracer) else np).pad(w, pads)
    b = None if s.b is None else em.value(s.b)
    return {s.out: emit_conv(em, s, em.value(s.x), new_w, b, padding=m.padding)}


# ---- the fuzzer's side: a motif that makes the rule fire, and its mutants ----------


def enlarge_off_centre():
    """enlarge_conv_kernel zero-padding the kernel on one side only (the old taps shift)."""
    from mlsys_jax.passes.rules import enlarge_conv_kernel as rule

    def wrong(pad):
        def f(w, pads, *a, **kw):
            return pad(w, [(0, lo + hi) for lo, hi in pads], *a, **kw)
        return f
    return during(rule.enlarge_conv_kernel(), (rule, "np", proxy(rule.np, pad=wrong)),
                   (rule, "jnp", proxy(rule.jnp, pad=wrong)))


RULE = Rule(
    name=__name__.rpartition(".")[2],  # a rule is named by its module
    what="zero-pad a kernel to a parallel conv's window (§4.2 step 3)",
    match=match, emit=emit,
    caveat=f"{FINITE_ONLY}: a zero tap times an Inf input is NaN (0·Inf)",
    primitives=frozenset({CONV}),
    # its anchor, parallel convs of two kernel sizes, is merge_parallel_convs's motif's to draw
    motif=merge_parallel_convs.motif, motif_weight=0, order=3, mutants=(
        RuleMutant("enlarge_off_centre", enlarge_off_centre,
                   "1x1 kernel zero-padded on one side: the tap moves off centre"),))


def enlarge_conv_kernel(size: int | None = None, only: int | None = None) -> Pass:
    """Grow a conv's kernel by zero-padding it and widening its padding so the output keeps its
    shape and value (§4.2 step ③, "worse before better"). Default: grow to the window of a
    parallel conv on the same input, placing the old kernel at the tap that gives the partner's
    padding (so the two can merge; refused with the reason where no tap does); ``size=k``: grow
    every smaller kernel to k×k, centred. Needs a finite input (0·Inf = NaN in the new taps):
    every rewrite's log line says so."""
    return RULE.make_pass(only, size=size)
