"""The sentences of a separability verdict: why a loss is not separable, and why it is equal on
this batch anyway.

A batch-wide sum the loss is normalised by is described from the dataflow that made it (``the
count of entries with batch['inputs'] > 0``) and evaluated per shard (:class:`Statistics`), so
"equal on this batch" says what made it so: every shard holds the same count.
"""
from __future__ import annotations

import re
from collections import OrderedDict

import jax
import numpy as np

from mlsys_jax.compat import Literal, dce_jaxpr_consts, new_jaxpr
from mlsys_jax.ir import bodies
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.parallel.shard.batch.axis import KINDS
from mlsys_jax.parallel.shard.batch.flags import FLAGS

_COMPARE = {"gt": ">", "ge": ">=", "lt": "<", "le": "<=", "ne": "!=", "eq": "=="}
_PASS = ("convert_element_type", "copy", "copy_p")
_BN = re.compile(r"batch_?norm|normaliz", re.IGNORECASE)


class Statistics:
    """Evaluates the batch-wide sums of a loss on the whole batch and on each shard.

    ``closed``/``closed_shard``: the loss traced at the whole batch and at one shard; ``names``:
    ``{invar: "batch['x']"}`` for the batch leaves of ``closed``.
    """

    def __init__(self, closed, closed_shard, names: dict, args: list, shard_args: list):
        self.closed, self.shard, self.names = closed, closed_shard, names
        self.args, self.shard_args = args, shard_args

    def describe(self, s) -> str:
        """What a batch-wide sum adds up, from the equations that made its operand (seen
        through casts, ``jnp.where`` and calls): ``the count of entries with batch['inputs'] >
        0``, ``the sum of batch['w']``, else where it was formed."""
        chain, last = _chain(self.closed.jaxpr, s.eqn.invars[0])
        end = chain[-1] if chain else None
        if end is None and last in self.names:
            return f"the sum of {self.names[last]}"
        if end is not None and end.primitive.name in _COMPARE:
            a, lit = end.invars
            if not isinstance(a, Literal) and a in self.names and isinstance(lit, Literal):
                return (f"the count of entries with {self.names[a]} {_COMPARE[end.primitive.name]}"
                        f" {lit.val} (non-padding)")
        return f"a sum over the batch ({s.primitive} at {s.path})"

    def values(self, s):
        """``(whole batch, [per shard])`` of a top-level batch-wide sum that depends on the batch
        alone, or None."""
        v = s.top_var
        if v is None or not s.path.isdigit():
            return None
        i = int(s.path)
        if i >= len(self.shard.jaxpr.eqns) or \
                self.shard.jaxpr.eqns[i].primitive is not self.closed.jaxpr.eqns[i].primitive:
            return None
        whole = _value(self.closed, v, self.args)
        shard_var = self.shard.jaxpr.eqns[i].outvars[list(self.closed.jaxpr.eqns[i].outvars).index(v)]
        shards = [_value(self.shard, shard_var, a) for a in self.shard_args]
        if whole is None or any(x is None for x in shards):
            return None
        return whole, shards


def _producer(jaxpr, var):
    if isinstance(var, Literal):
        return None
    return next((e for e in jaxpr.eqns if var in e.outvars), None)


def _chain(jaxpr, var) -> tuple[list, object]:
    """The equations back from ``var`` along first operands through casts and selects (to the
    predicate), into calls and out of them again; the chain ends at a comparison, another
    primitive, or an input of the top jaxpr (then the last entry is None and the second result
    is that input)."""
    out, frames = [], [(jaxpr, {})]          # (jaxpr, its inputs -> the caller's values)
    for _ in range(64):
        here, outer = frames[-1]
        eqn = _producer(here, var)
        if eqn is None:
            if var in outer:                 # a body's input: continue in the caller
                frames.pop()
                var = outer[var]
                continue
            out.append(None)
            break
        found = bodies(eqn)
        if eqn.primitive.name in TRANSPARENT_CALLS and len(found) == 1:
            body = found[0].jaxpr
            frames.append((body, {bv: ov for bv, ov in zip(body.invars, eqn.invars)}))
            var = body.outvars[list(eqn.outvars).index(var)]
            continue
        out.append(eqn)
        if eqn.primitive.name not in _PASS + ("select_n",) or isinstance(eqn.invars[0], Literal):
            break
        var = eqn.invars[0]
    return out, var


def _value(closed, var, args):
    """``var``'s value on ``args`` when it depends on no parameter (None otherwise)."""
    sub = new_jaxpr(closed.jaxpr, closed.jaxpr.constvars, [var], closed.jaxpr.eqns)
    pruned, used_consts, used_inputs = dce_jaxpr_consts(sub, [True])
    inputs = [a for a, u in zip(args, used_inputs) if u]
    if any(a is None for a in inputs):
        return None
    consts = [c for c, u in zip(closed.consts, used_consts) if u]
    out = jax.core.eval_jaxpr(pruned, consts, *inputs)[0]
    return float(np.asarray(out).sum()) if np.ndim(out) else float(out)


def _group(mixing) -> "OrderedDict":
    out: OrderedDict = OrderedDict()
    for m in mixing:
        out.setdefault(m.kind, []).append(m)
    return out


def _fold_text(folded: int) -> str:
    return ("each shard folds its index into the key (jax.random.fold_in(key, shard)), so shards "
            "draw different masks" if folded else
            "this run could not reach the key to fold in the shard index, so every shard draws "
            "the same mask: pass the key in as a closed-over jax.random.key")


def cause(kind: str, group: list, folded: int, stats: Statistics | None, sums: list) -> str:
    first, more = group[0], (f" ({len(group)} such equations)" if len(group) > 1 else "")
    if kind == "statistic":
        what = ("training-mode BatchNorm" if any(_BN.search(m.trace) for m in group)
                else "a batch statistic used per example (e.g. inputs centred by the batch mean)")
        return (f"{what}: {first.describe()}{more}: each shard normalises by its own statistics, "
                "as data parallelism without synchronised BatchNorm does")
    if kind == "normaliser":
        s = sums[first.origin]
        what = stats.describe(s) if stats is not None else "a batch-wide sum"
        got = stats.values(s) if stats is not None else None
        per = (f": {', '.join(f'{v:g}' for v in got[1])} in the shards, {got[0]:g} in the batch"
               if got else "")
        return (f"the loss is normalised by {what}, a batch-wide sum ({s.primitive} at {s.path}"
                f"{', ' + first.where if first.where else ''}){per}: data parallelism divides "
                "each shard's sum by the shard's own")
    if kind == "position" and first.random:
        return (f"the loss draws random numbers (e.g. dropout) from a PRNG key fixed inside it "
                f"(closed over or made there; {first.describe()}): one device draws one mask for "
                f"the whole batch, data parallelism one per shard; {_fold_text(folded)}")
    if kind == "unfollowed":
        return _unfollowed(group)
    return f"{KINDS[kind]}: {first.describe()}{more}"


def _unfollowed(group: list) -> str:
    """What the walk could not decide: batch-wide flags (equinox's ``unvmap_any``, which steer
    a loop or a check for the whole batch) apart from primitives it has no rule for."""
    flags = [m for m in group if m.primitive in FLAGS]
    rest = [m for m in group if m.primitive not in FLAGS]
    parts = []
    if rest:
        prims = sorted({m.primitive for m in rest})
        parts.append(f"the dataflow walk could not follow the batch axis through "
                     f"{', '.join(prims)} ({rest[0].describe()})")
    if flags:
        prims = sorted({m.primitive for m in flags})
        n = f"{len(flags)} batch-wide flags" if len(flags) > 1 else "a batch-wide flag"
        parts.append(f"{n} ({', '.join(prims)} over the examples; the first at {flags[0].path}"
                     f"{', ' + flags[0].where if flags[0].where else ''}) steer loops or checks "
                     "for the whole batch, and the examples stay apart only if each one's values "
                     "come out as they would alone, which the dataflow does not show")
    return "; ".join(parts) + ": the gradients decide"


def why_equal(mixing: list, stats: Statistics | None, sums: list) -> str:
    """Why a loss that mixes examples still equals its shards' mean on this batch."""
    reasons = []
    for m in mixing:
        if m.kind == "normaliser" and stats is not None:
            s = sums[m.origin]
            got = stats.values(s)
            if got and len({round(v, 6) for v in got[1]}) == 1:
                reasons.append(f"every shard holds the same value of {stats.describe(s)} "
                               f"({got[1][0]:g} of the batch's {got[0]:g}), so each shard's "
                               "share of the loss is weighted as one device weighs it")
    if not reasons:
        reasons.append("the gradients of the whole batch and of the shards agree at every point "
                       "checked (given and perturbed parameters, example and shuffled rows)")
    return "; ".join(dict.fromkeys(reasons))


def _unexplained(grads, unfollowed: list) -> str:
    """The gradients differ and no equation the walk followed mixes examples. Where it stopped
    (a primitive without a rule) everything after is unexamined, so the mixing is there or after
    it: said so, never "no equation mixes examples" beside the equation just named."""
    differ = (f"the whole batch's gradients and the shards' differ by {grads.diff:.3g} "
              f"(noise {grads.noise:.3g})")
    if unfollowed:
        where = ", ".join(f"{m.primitive} at {m.path}" for m in unfollowed)
        return (f"{differ}: the examples are mixed at or after the equations the walk could not "
                f"follow ({where})")
    return f"{differ} although the dataflow walk found no equation that mixes examples"


def causes_of(walk, equal_here: bool, summed: bool, grads, folded: int,
              stats: Statistics | None) -> tuple[list, list, str]:
    """``(causes, notes, why equal here)`` of a separability verdict: one sentence per reason
    the loss is not separable; notes on what the dataflow could not follow when the gradients
    settled it; and why it is equal on this batch anyway."""
    unsynced = [m for m in walk.mixing if not m.synced]
    real = [m for m in unsynced if m.kind != "unfollowed"]
    causes = []
    if summed:
        causes.append("the loss sums over the batch instead of averaging (whole-batch loss = N x "
                      "the mean of the shards' losses): data parallelism averages the shards, so "
                      "its gradient is 1/N of one device's; divide the loss by the batch size")
    causes += [cause(k, g, folded, stats, walk.sums) for k, g in _group(unsynced).items()]
    if not equal_here and not real and not summed:
        causes.append(_unexplained(grads, [m for m in unsynced if m.kind == "unfollowed"]))
    notes = []
    if equal_here and not real and not summed and causes:   # the gradients settled it
        notes, causes = causes, []
    why = why_equal(real, stats, walk.sums) if equal_here and real else ""
    return causes, notes, why
