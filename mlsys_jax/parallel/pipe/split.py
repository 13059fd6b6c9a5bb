"""The traced loss cut into stages: what each stage computes, reads and hands on.

Given the units (``units.py``) and a stage per unit, every top-level equation gets a stage: its
unit's, or later if one of its inputs is computed later (an equation never runs before what it
reads; a head tied to the embedding runs on the last stage). A stack scan is cut into *pieces*,
one per stage holding some of its iterations, each a scan of fewer iterations over its slice of
the stacked parameters, the carry handed from piece to piece. The microbatch is on every stage.

A value computed on stage a and read on stage b > a crosses boundaries a, ..., b-1: stage a
sends it, the stages between pass it on. Those values are the point-to-point traffic.

Only values that depend on both the parameters and the batch are staged: what the batch alone
or the parameters alone determine (a causal mask, a tied weight's transpose) is recomputed by
each stage that reads it. Each parameter leaf is *owned* by the one stage that reads it, split
by *rows* when a stack's pieces read its slices, or *replicated* on every stage when several
stages read it whole (a tied embedding) or it is a scalar; a replicated leaf's gradient is
summed over the stages.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import jax

from mlsys_jax.compat import Literal, Var, bind_equation
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir import eval_jaxpr
from mlsys_jax.parallel.pipe.units import Units, reads


@dataclass(frozen=True)
class StackPiece:
    """Iterations [lo, hi) of the stack scan at equation ``eqn``, on one stage."""

    eqn: int
    lo: int
    hi: int
    carry_in: tuple
    carry_out: tuple


@dataclass(frozen=True)
class LeafPlacement:
    """Where a parameter leaf lives: ``owned`` by ``owner``, ``rows`` (``rows[s]`` = stage s's
    (lo, hi) of the leading axis), or ``replicated`` on every stage."""

    kind: str
    owner: int = 0
    rows: tuple = ()


@dataclass
class StagePart:
    """What stage ``index`` computes: ``ops`` (equation indices and pieces, in order), the
    boundary values it receives (``inputs``) and sends (``outputs``; the last stage: the loss)."""

    index: int
    ops: tuple
    inputs: tuple
    outputs: tuple
    whole_reads: frozenset = frozenset()
    row_reads: dict = field(default_factory=dict)


@dataclass
class Split:
    closed: object
    n_params: int
    units: Units
    stage_of_unit: tuple
    parts: list
    boundaries: list          # per boundary k (between stage k and k+1): the keys crossing it
    avals: dict               # key -> aval of every boundary value
    placements: list          # per parameter leaf

    @property
    def stages(self) -> int:
        """The number of stages the loss was cut into."""
        return len(self.parts)

    def boundary_bytes(self, k: int) -> int:
        """Bytes of the activations crossing boundary k (one microbatch)."""
        from mlsys_jax.ir.trace import aval_bytes
        return sum(aval_bytes(self.avals[v]) for v in self.boundaries[k])


def _carry_key(eqn: int, stage: int, j: int):
    return ("carry", eqn, stage, j)


def build_split(closed, n_params: int, units: Units, stage_of_unit) -> Split:
    """Assign every equation a stage for ``stage_of_unit`` (non-decreasing, one per unit)."""
    jaxpr = closed.jaxpr
    stages = max(stage_of_unit) + 1
    params = set(jaxpr.invars[:n_params])
    on_params, on_batch = set(params), set(jaxpr.invars[n_params:])
    dep = set()                  # staged values: they depend on the parameters and the batch
    made: dict = {}              # key -> stage that computes it (staged values)
    ops: list[list] = [[] for _ in range(stages)]
    free: list[int] = []
    avals: dict = {}
    reads_at: list[tuple] = []   # (stage, key) for every read of a staged value

    def producer(v) -> int:
        return made.get(v, 0)

    for i in sorted(units.live):
        e = jaxpr.eqns[i]
        ins = reads(e)
        p = any(v in on_params or v in dep for v in ins)
        b = any(v in on_batch or v in dep for v in ins)
        if not (p and b):  # parameters alone (a tied weight transposed) or the batch alone
            (on_params if p else on_batch if b else set()).update(e.outvars)
            free.append(i)
            continue
        dep.update(e.outvars)
        if i in units.first:
            for piece in _pieces(e, i, units, stage_of_unit):
                s = stage_of_unit[units.first[i] + piece.lo]
                ops[s].append(piece)
                nc, nk = e.params["num_consts"], e.params["num_carry"]
                operands = [v for v in e.invars[:nc] + e.invars[nc + nk:]
                            if not isinstance(v, Literal)] + list(piece.carry_in)
                reads_at += [(s, v) for v in operands if isinstance(v, tuple) or v in dep]
                for j, k in enumerate(piece.carry_out):
                    made[k] = s
                    avals[k] = e.outvars[j].aval
            continue
        u = units.unit_of[i]
        s = max([stage_of_unit[u] if u is not None else 0] +
                [producer(v) for v in ins if v in dep])
        ops[s].append(i)
        reads_at += [(s, v) for v in ins if v in dep]
        for v in e.outvars:
            made[v] = s
    loss = jaxpr.outvars[0]
    if not isinstance(loss, Var) or loss not in made:
        raise MlsysError("pipeline: the loss does not depend on the parameters; nothing to train")
    if made[loss] != stages - 1:
        raise MlsysError(f"pipeline: the loss is computed on stage {made[loss] + 1} of {stages}; "
                         "the later stages compute nothing it needs (use fewer stages)")
    crossing: dict = {}
    for s, v in reads_at:
        a = made[v]
        if a > s:
            raise MlsysError(f"pipeline: stage {s + 1} reads a value stage {a + 1} computes")
        for k in range(a, s):
            crossing.setdefault(k, {})[v] = None
        avals.setdefault(v, getattr(v, "aval", None))
    boundaries = [tuple(crossing.get(k, {})) for k in range(stages - 1)]
    parts = []
    for s in range(stages):
        inputs = boundaries[s - 1] if s else ()
        outputs = boundaries[s] if s < stages - 1 else (loss,)
        parts.append(_part(jaxpr, s, ops[s], free, inputs, outputs, params))
    placements = _placements(jaxpr, n_params, parts, units)
    return Split(closed, n_params, units, tuple(stage_of_unit), parts, boundaries, avals,
                 placements)


def _pieces(e, i: int, units: Units, stage_of_unit) -> list[StackPiece]:
    """The stack scan at equation i cut where its iterations change stage."""
    first, n = units.first[i], e.params["length"]
    nc, nk = e.params["num_consts"], e.params["num_carry"]
    runs, lo = [], 0
    for it in range(1, n + 1):
        if it == n or stage_of_unit[first + it] != stage_of_unit[first + lo]:
            runs.append((lo, it))
            lo = it
    pieces, carry = [], tuple(e.invars[nc: nc + nk])
    for r, (lo, hi) in enumerate(runs):
        s = stage_of_unit[first + lo]
        out = tuple(e.outvars[:nk]) if r == len(runs) - 1 else \
            tuple(_carry_key(i, s, j) for j in range(nk))
        pieces.append(StackPiece(i, lo, hi, carry, out))
        carry = out
    return pieces


def _part(jaxpr, s, own, free, inputs, outputs, params) -> StagePart:
    """Stage s's operations: its own plus the batch-only equations they need, in order."""
    need = set()
    for op in own:
        e = jaxpr.eqns[op.eqn if isinstance(op, StackPiece) else op]
        need.update(reads(e))
    made_by = {v: i for i in free for v in jaxpr.eqns[i].outvars}
    extra = set()
    stack = [v for v in need if v in made_by]
    while stack:
        i = made_by[stack.pop()]
        if i not in extra:
            extra.add(i)
            stack += [v for v in reads(jaxpr.eqns[i]) if v in made_by]
    order = sorted([(op.eqn if isinstance(op, StackPiece) else op, k, op) for k, op in
                    enumerate(own)] + [(i, -1, i) for i in extra], key=lambda t: t[:2])
    whole, rows = set(), {}
    for op in list(own) + sorted(extra):
        e = jaxpr.eqns[op.eqn if isinstance(op, StackPiece) else op]
        stacked = _stacked_positions(e) if isinstance(op, StackPiece) else ()
        for j, v in enumerate(e.invars):
            if not isinstance(v, Literal) and v in params:
                if j in stacked:
                    rows[v] = (op.lo, op.hi)
                else:
                    whole.add(v)
    return StagePart(s, tuple(op for _, _, op in order), tuple(inputs), tuple(outputs),
                     frozenset(whole), rows)


def _stacked_positions(e) -> range:
    return range(e.params["num_consts"] + e.params["num_carry"], len(e.invars))


def _placements(jaxpr, n_params, parts, units) -> list[LeafPlacement]:
    out = []
    for v in jaxpr.invars[:n_params]:
        whole = [p.index for p in parts if v in p.whole_reads]
        rows = {p.index: p.row_reads[v] for p in parts if v in p.row_reads}
        if not v.aval.shape:
            out.append(LeafPlacement("replicated"))
        elif not whole and not rows:
            out.append(LeafPlacement("owned", 0))
        elif not rows and len(whole) == 1:
            out.append(LeafPlacement("owned", whole[0]))
        elif not whole and len(rows) == 1:
            out.append(LeafPlacement("owned", next(iter(rows))))
        elif not whole:
            out.append(LeafPlacement("rows", rows=tuple(rows.get(s, (0, 0))
                                                    for s in range(len(parts)))))
        else:
            out.append(LeafPlacement("replicated"))
    return out


def run_part(split: Split, s: int, leaves: dict, acts, batch, unrolled: bool = False) -> list:
    """Stage s's outputs from its parameters (``{leaf index: value}``; a rows leaf as its
    slice), the boundary values it receives and the microbatch's leaves (traceable).

    ``unrolled`` runs each stack piece as one body per iteration instead of a scan: the same
    values, and the jaxpr the cost model prices as XLA runs a scan (the body's kernels once per
    iteration; it prices a scan equation as one kernel).
    """
    jaxpr, part = split.closed.jaxpr, split.parts[s]
    env: dict = dict(zip(jaxpr.constvars, split.closed.consts))
    env.update(zip(jaxpr.invars[split.n_params:], batch))
    env.update((jaxpr.invars[i], x) for i, x in leaves.items())
    env.update(zip(part.inputs, acts))

    def read(v):
        return v.val if isinstance(v, Literal) else env[v]

    for op in part.ops:
        if isinstance(op, StackPiece):
            env.update(zip(op.carry_out, _run_piece(jaxpr.eqns[op.eqn], op, read, unrolled)))
            continue
        e = jaxpr.eqns[op]
        env.update(zip(e.outvars, bind_equation(e, [read(v) for v in e.invars])))
    return [read(v) for v in part.outputs]


def _run_piece(e, op: StackPiece, read, unrolled: bool) -> list:
    nc, nk = e.params["num_consts"], e.params["num_carry"]
    consts = [read(v) for v in e.invars[:nc]]
    carry = [read(v) for v in op.carry_in]
    xs = [read(v) for v in e.invars[nc + nk:]]
    xs = [x if x.shape[0] == op.hi - op.lo else jax.lax.slice_in_dim(x, op.lo, op.hi) for x in xs]
    if unrolled:
        body = e.params["jaxpr"]
        for i in range(op.hi - op.lo):
            carry = eval_jaxpr(body.jaxpr, body.consts, *consts, *carry,
                               *[x[i] for x in xs])[:nk]
        return carry
    sub = e.replace(params=dict(e.params, length=op.hi - op.lo))
    return bind_equation(sub, consts + carry + xs)[:nk]
