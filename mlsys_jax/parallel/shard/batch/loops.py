"""The batch axis through control flow (a mixin of ``rules.Rules``): cond branches, while loops
and scans.

A loop is followed to a fixed point of its carries' states. A carry that starts free of the batch
(zeros, a broadcast constant: an RNN's initial state) and comes back holding examples is promoted
to rows *before* the fixed point is sought: walking the body once with the free start would pair
the examples of ``x_t`` with the start's values and record a mixing that the settled loop does not
have. The start must then be uniform along the carry's batch axis (a start that differs from
position to position of the batch is position mixing).

A scan whose ``xs`` run along the batch axis (``lax.map`` of per-example losses) visits one example
per iteration: it is a map over the examples when nothing flows from one iteration to the next,
and a linear batch-wide sum when a carry only accumulates ``carry + f(example)``. Anything else
carried over examples mixes them (an RNN run over the batch axis).
"""
from __future__ import annotations

from mlsys_jax.compat import Literal
from mlsys_jax.parallel.shard.batch.axis import Free, Mixed, Rows, join

_ROUNDS = 4


def _shape(v) -> tuple:
    return tuple(getattr(v.aval, "shape", ()))


def _var_deps(jaxpr) -> dict:
    """``{var: input indices it depends on}`` (an equation's outputs depend on all its inputs:
    nested bodies are not looked into)."""
    dep = {v: {i} for i, v in enumerate(jaxpr.invars)}
    for eqn in jaxpr.eqns:
        got = set().union(*(dep.get(v, set()) for v in eqn.invars if not isinstance(v, Literal)))
        for v in eqn.outvars:
            dep[v] = got
    return dep


def depends(jaxpr) -> list:
    """For each output of ``jaxpr``, the set of input indices it depends on."""
    dep = _var_deps(jaxpr)
    return [set() if isinstance(v, Literal) else set(dep.get(v, set())) for v in jaxpr.outvars]


def _uncast(jaxpr, var):
    """``var`` seen back through casts and copies (a weakly typed carry is cast each step)."""
    for _ in range(len(jaxpr.eqns)):
        eqn = None if isinstance(var, Literal) else next(
            (e for e in jaxpr.eqns if var in e.outvars), None)
        if eqn is None or eqn.primitive.name not in ("convert_element_type", "copy", "copy_p"):
            return var
        var = eqn.invars[0]
    return var


def _accumulates(jaxpr, i: int, carries: set) -> bool:
    """Whether carry output ``i`` is ``carry_in[i] + g`` with ``g`` independent of every carry
    (input indices ``carries``): a running sum over the iterations."""
    out, carry_in = _uncast(jaxpr, jaxpr.outvars[i]), jaxpr.invars[min(carries) + i]
    eqn = next((e for e in jaxpr.eqns if out in e.outvars), None)
    if eqn is None or eqn.primitive.name not in ("add", "add_any"):
        return False
    a, b = (_uncast(jaxpr, v) for v in eqn.invars)
    other = eqn.invars[1] if a is carry_in else eqn.invars[0] if b is carry_in else None
    if other is None or isinstance(other, Literal):
        return other is not None
    return not _var_deps(jaxpr).get(other, set()) & carries


def _per_example(eqn, pred) -> bool:
    """The loop's predicate holds one flag per example along dimension 0 of every carry: the
    shape ``vmap`` gives a ``while_loop`` whose condition depends on the example. XLA's lowering
    then updates only the carries of examples whose flag is set (a select per trip), so each
    example runs its own trips."""
    if not isinstance(pred, Rows) or pred.dim != 0 or pred.inner != 1:
        return False
    shape = _shape(eqn.outvars[0]) if eqn.outvars else ()
    lead = _shape(eqn.params["cond_jaxpr"].jaxpr.outvars[0])
    return len(lead) == 1 and all(_shape(v)[:1] == lead for v in eqn.outvars) and bool(shape)


class Loops:
    """Mixin of :class:`rules.Rules` (``self.walk``, ``self.call``)."""

    def p_cond(self, eqn, ins, path):
        if not isinstance(ins[0], Free):
            return [self.walk.record("control", eqn, path, "a branch is chosen by the batch")] \
                * len(eqn.outvars)
        outs = None
        for i, branch in enumerate(eqn.params["branches"]):
            got = self.call(branch.jaxpr, branch.consts, ins[1:], f"{path}/cond.branches[{i}]/")
            outs = got if outs is None else [self._join(eqn, path, a, b) for a, b in zip(outs, got)]
        return outs

    def _join(self, eqn, path: str, a, b):
        for f, r in ((a, b), (b, a)):   # a free start meets rows: uniform along the batch axis?
            if isinstance(f, Free) and isinstance(r, Rows) and r.dim in f.varying:
                return self.walk.record("position", eqn, path, "a loop carry or branch output "
                                        "starts from values that vary along the batch axis but "
                                        "do not come from the batch")
        out = join(a, b)
        if out is None:
            return self.walk.record("control", eqn, path, "a loop carry or branch output holds "
                                    "examples in one case and something else in another")
        return out

    def _promote(self, eqn, path: str, run, carry: list) -> list:
        """Free starting carries that come back as rows, promoted to those rows (a start that
        varies along their batch axis is recorded as position mixing). The walks made here are
        trials: what they record is dropped."""
        mark, bad = len(self.walk.mixing), {}
        if not any(isinstance(c, Free) for c in carry):
            return carry
        for _ in range(len(carry) + 1):   # (the trials start free carries uniform)
            new, _ = run([Free(frozenset(), c.random) if isinstance(c, Free) else c
                          for c in carry])
            del self.walk.mixing[mark:]
            promoted = list(carry)
            for i, (c, n) in enumerate(zip(carry, new)):
                if isinstance(c, Free) and isinstance(n, Rows):
                    if n.dim in c.varying:
                        bad[i] = n
                    else:
                        promoted[i] = n
            done = promoted == carry or not any(isinstance(c, Free) for c in promoted)
            carry = promoted
            if done:
                break
        for i, n in bad.items():
            carry[i] = self._join(eqn, path, carry[i], n)
        return carry

    def _fixpoint(self, eqn, path: str, run, carry: list) -> tuple[list, list]:
        """Iterate ``run(carry) -> (new carry, other outputs)`` until the carry states settle;
        what the walks before the settled carry record is dropped unless the carry holds it."""
        carry = self._promote(eqn, path, run, list(carry))
        mark = len(self.walk.mixing)
        for rounds in range(_ROUNDS):
            new, rest = run(carry)
            joined = [self._join(eqn, path, a, b) for a, b in zip(carry, new)]
            if joined == carry:
                if rounds and not any(isinstance(s, Mixed) and s.cause >= mark for s in carry):
                    del self.walk.mixing[mark:]
                    _, rest = run(carry)
                return carry, rest
            carry = joined
        return [self.walk.record("control", eqn, path, "a loop carry does not settle")] \
            * len(carry), rest

    def p_scan(self, eqn, ins, path):
        p = eqn.params
        nc, ncar, body = p["num_consts"], p["num_carry"], p["jaxpr"]
        consts, carry, xs = ins[:nc], ins[nc:nc + ncar], ins[nc + ncar:]
        if any(isinstance(s, Rows) and s.dim == 0 for s in xs):
            return self._scan_over_batch(eqn, ins, path)
        sliced = [Rows(s.dim - 1, s.inner) if isinstance(s, Rows) else s if not isinstance(
            s, Free) else Free(frozenset(d - 1 for d in s.varying if d > 0), s.random) for s in xs]

        def run(c):
            out = self.call(body.jaxpr, body.consts, consts + c + sliced, f"{path}/scan.jaxpr/")
            return out[:ncar], out[ncar:]
        carry, ys = self._fixpoint(eqn, path, run, list(carry))
        stacked = [Rows(s.dim + 1, s.inner) if isinstance(s, Rows) else s if not isinstance(
            s, Free) else Free(frozenset(d + 1 for d in s.varying) | {0}, s.random) for s in ys]
        return carry + stacked

    def _scan_over_batch(self, eqn, ins, path):
        """A scan whose iterations are the examples: a map, a running sum, or mixing."""
        p = eqn.params
        nc, ncar, jaxpr = p["num_consts"], p["num_carry"], p["jaxpr"].jaxpr
        n_out = len(eqn.outvars)
        r = next(s for s in ins[nc + ncar:] if isinstance(s, Rows) and s.dim == 0)
        if any(isinstance(s, Rows) and s != r for s in ins[nc + ncar:]):
            return [self.walk.record("pairs", eqn, path, "a scan over the batch axis meets "
                                     "examples of another value at each step")] * n_out
        if any(not isinstance(s, Free) for s in ins[:nc + ncar]):
            return [self.walk.record("unfollowed", eqn, path, "a scan over the batch axis also "
                                     "reads batch-dependent values at each step")] * n_out
        examples = {nc + ncar + i for i, s in enumerate(ins[nc + ncar:]) if s == r}
        carry_in = jaxpr.invars[nc:nc + ncar]
        changing = {nc + i for i in range(ncar) if jaxpr.outvars[i] is not carry_in[i]}
        position = changing | {nc + ncar + i for i, s in enumerate(ins[nc + ncar:])
                               if isinstance(s, Free) and 0 in s.varying}
        dep = depends(jaxpr)
        holding = set(examples)   # inputs whose values hold examples, carries closed over
        for _ in range(ncar + 1):
            holding |= {nc + i for i in range(ncar) if dep[i] & holding}
        outs = []
        for i in range(ncar):
            if nc + i not in holding:
                outs.append(Free(frozenset(d for d, s in enumerate(_shape(eqn.outvars[i]))
                                           if s > 1)))
            elif _accumulates(jaxpr, i, set(range(nc, nc + ncar))) \
                    and not dep[i] & (position - {nc + i}):
                outs.append(self.walk.new_sum(eqn, path))
            else:
                return [self.walk.record("order", eqn, path, "a scan over the batch axis "
                                         "carries values from one example to the next")] * n_out
        for k, d in enumerate(dep[ncar:]):
            v = eqn.outvars[ncar + k]
            if d & (holding - examples):
                outs.append(self.walk.record("order", eqn, path, "a scan over the batch axis "
                                             "carries values from one example to the next"))
            elif d & holding and d & position:
                outs.append(self.walk.record("position", eqn, path, "each example of a scan "
                                             "over the batch axis meets a value that changes "
                                             "from step to step"))
            elif d & holding:
                outs.append(Rows(0, r.inner))
            else:
                outs.append(Free(frozenset(j for j, s in enumerate(_shape(v)) if s > 1)))
        return outs

    def p_while(self, eqn, ins, path):
        p = eqn.params
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = ins[:cn], ins[cn:cn + bn], ins[cn + bn:]
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]

        def run(c):
            pred = self.call(cj.jaxpr, cj.consts, cconsts + c, f"{path}/while.cond_jaxpr/")[0]
            if _per_example(eqn, pred):
                out = self.call(bj.jaxpr, bj.consts, bconsts + c, f"{path}/while.body_jaxpr/")
                return [self._held(eqn, path, a, b) for a, b in zip(c, out)], []
            if not isinstance(pred, Free):
                return [self.walk.record("control", eqn, path, "a loop's trip count depends on "
                                         "the batch")] * len(c), []
            return self.call(bj.jaxpr, bj.consts, bconsts + c, f"{path}/while.body_jaxpr/"), []
        carry, _ = self._fixpoint(eqn, path, run, list(carry))
        return carry

    def _held(self, eqn, path: str, old, new):
        """A carry of a loop with one predicate per example: ``select(pred, new, old)`` along the
        batch axis, so it holds examples whatever the states of ``old`` and ``new``."""
        rows = Rows(0)
        for s in (old, new):
            if isinstance(s, Mixed):
                return s
            if isinstance(s, Free) and 0 in s.varying:
                return self.walk.record("position", eqn, path, "a loop carry starts from values "
                                        "that vary along the batch axis but do not come from the "
                                        "batch")
            if isinstance(s, Rows) and s != rows:
                return self.walk.record("pairs", eqn, path, "a loop with one predicate per "
                                        "example carries examples along another axis")
            if not isinstance(s, (Rows, Free)):
                return self.statistic(eqn, path, s, s.synced, rows)
        return rows

