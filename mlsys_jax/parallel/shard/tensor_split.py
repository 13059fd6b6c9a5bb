"""Megatron's tensor-parallel splits found in the dataflow of a loss, not in parameter names (§5.2).

A weight whose matmul *produces* features can be split by those features (column-parallel) when
every path from its output reaches a second weight's matmul that *contracts* them (row-parallel)
through work that keeps the features apart: elementwise ops (activations, dropout, biases),
reshapes into heads, and matmuls that carry them as a batch dimension (attention scores and
values, per head). Then each device holds 1/M of both weights and the pair needs one all-reduce in
the forward pass. Weights that meet on the way (GLU's gate and value; query, key and value through
the scores) form one group. A weight whose features are reduced, sorted, gathered or reach the
loss before a second matmul (a classifier head after a LayerNorm, a tied unembedding) is not split.

:func:`derive` walks the loss's jaxpr with calls (jit, custom_jvp/vjp, remat) flattened, tagging
each value that holds split features with its group and dimension, and returns the splits, the
groups and, for every parameter left whole, the reason.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

from jax.sharding import PartitionSpec as P

from mlsys_jax.compat import Literal
from mlsys_jax.ir import bodies, primitives as prims
from mlsys_jax.parallel.axes import MODEL
from mlsys_jax.parallel.shard.matmul_dims import free_dims, out_dim as matmul_out_dim

_VIEWS = frozenset({"convert_element_type", "copy", "copy_p", "transpose"})
_SHAPES = frozenset({"reshape", "broadcast_in_dim", "squeeze", "expand_dims"})
_KEEP = prims.ELEMENTWISE | {"clamp", "select_n"}


@dataclass
class _Group:
    columns: list = field(default_factory=list)   # (param, dim)
    rows: list = field(default_factory=list)      # (param, dim)
    biases: list = field(default_factory=list)    # (param, dim)
    failed: str = ""
    parent: int | None = None


@dataclass(frozen=True)
class TensorSplit:
    """Splits over the model axis found in the dataflow."""

    specs: dict            # keystr path -> PartitionSpec of every split parameter
    groups: tuple          # ({"column": [paths], "row": [paths], "bias": [paths]}, ...)
    replicated: dict       # keystr path -> why it stays whole
    row_matmuls: int       # Megatron's forward all-reduces: one per row-parallel matmul run
    #                        (a layer stack's, once per trip of its scan)


class _Value:
    """One value of the flattened program: a variable of one inlined copy of a body (a body
    shared by several calls, such as relu's, has the same variables in every copy)."""

    __slots__ = ("var", "copy", "aval")

    def __init__(self, var, copy: int):
        self.var, self.copy, self.aval = var, copy, var.aval

    def __hash__(self):
        return hash((id(self.var), self.copy))

    def __eq__(self, other):
        return isinstance(other, _Value) and other.var is self.var and other.copy == self.copy


@dataclass
class _Loops:
    """What inlining a scan's body once leaves for the walk: each sliced input (a body value that
    is one trip's slice of an outer value along its axis 0) and the values a trip carries on."""

    slices: dict = field(default_factory=dict)    # body value -> the outer value it slices
    carried: list = field(default_factory=list)   # body values that leave a trip (carry, ys)
    trips: dict = field(default_factory=dict)     # body value -> the scan's trip count


def _flatten(jaxpr, copy: int, env: dict, out: list, counter: list, loops: _Loops) -> list:
    """Append ``(eqn, ins, outs)`` for every equation with calls inlined (each inlined body a
    fresh copy of its values) and each scan's body inlined once (``loops`` says how its values
    relate to the scan's: a layer stack's weights are sliced per trip); ``env`` maps this copy's
    variables to values. Returns the values of the jaxpr's outputs."""
    def value(v):
        if isinstance(v, Literal):
            return v
        if v not in env:
            env[v] = _Value(v, copy)
        return env[v]
    for eqn in jaxpr.eqns:
        found = bodies(eqn)
        if eqn.primitive.name in prims.TRANSPARENT_CALLS and len(found) == 1:
            b = found[0]
            counter[0] += 1
            inner = dict(zip(b.jaxpr.invars, [value(v) for v in eqn.invars]))
            results = _flatten(b.jaxpr, counter[0], inner, out, counter, loops)
            env.update(zip(eqn.outvars, results))
            continue
        if eqn.primitive.name == "scan":
            _inline_scan(eqn, [value(v) for v in eqn.invars], out, counter, loops)
            continue
        out.append((eqn, [value(v) for v in eqn.invars], [value(v) for v in eqn.outvars]))
    return [value(v) for v in jaxpr.outvars]


def _inline_scan(eqn, ins: list, out: list, counter: list, loops: _Loops) -> None:
    """One trip of a scan's body, inlined: constants are the outer values, the carry starts as
    the outer initial value, each ``xs`` value is a slice of the outer one. The scan's outputs
    stay fresh values (nothing split leaves a loop: the walk fails a split that reaches a
    carried value)."""
    body, n_fixed = eqn.params["jaxpr"].jaxpr, eqn.params["num_consts"] + eqn.params["num_carry"]
    counter[0] += 1
    inner = {}
    for k, (bv, outer) in enumerate(zip(body.invars, ins)):
        if k < n_fixed or isinstance(outer, Literal):
            inner[bv] = outer
        else:
            inner[bv] = _Value(bv, counter[0])
            loops.slices[inner[bv]] = outer
            loops.trips[inner[bv]] = int(eqn.params["length"])
    results = _flatten(body, counter[0], inner, out, counter, loops)
    loops.carried += [r for r in results if not isinstance(r, Literal)]


def derive(closed, param_paths: dict, size: int, axis: str = MODEL) -> TensorSplit:
    """Megatron splits of a loss traced as ``closed``; ``param_paths`` maps the invars of the
    trainable parameters to their keystr paths; ``size`` is the model axis' size."""
    flat, loops = [], _Loops()
    env = {v: _Value(v, 0) for v in closed.jaxpr.invars}
    outputs = _flatten(closed.jaxpr, 0, env, flat, [0], loops)
    paths = {env[v]: path for v, path in param_paths.items()}
    # A group that fails leaves its weights whole, so their outputs are plain values: walk again
    # without them until no new group fails (the next layers' matmuls become candidates).
    excluded: dict = {}
    while True:
        walk = _Walk(flat, paths, size, axis, outputs, excluded, loops)
        split = walk.run()
        failed = {p: g.failed for g in walk.groups if g.parent is None and g.failed
                  for p, _ in g.columns if p not in excluded}
        if not failed:
            return split
        excluded.update(failed)


class _Walk:
    def __init__(self, flat, param_paths, size, axis, outputs, excluded: dict, loops: _Loops):
        self.flat, self.paths, self.m, self.axis, self.outputs = flat, param_paths, size, axis, outputs
        self.loops = loops
        self.trips: dict = {}        # param -> the trips of the scan that slices it (1: none)
        self.excluded = excluded     # param -> why an earlier walk left it whole
        self.view: dict = {p: (p, tuple(range(len(p.aval.shape)))) for p in param_paths}
        # every value below is a _Value of the flattened program
        self.tag: dict = {}          # var -> (group, dim)
        self.groups: list = []
        self.uses: dict = {p: [] for p in param_paths}   # param -> [(primitive, eqn, operand)]
        self.derived: dict = {}      # var -> the parameter it is a reshape/broadcast of
        self.producer: dict = {}

    # ---- groups ------------------------------------------------------------------------------
    def root(self, g: int) -> int:
        while self.groups[g].parent is not None:
            g = self.groups[g].parent
        return g

    def union(self, a: int, b: int) -> int:
        a, b = self.root(a), self.root(b)
        if a != b:
            lo, hi = min(a, b), max(a, b)
            ga, gb = self.groups[lo], self.groups[hi]
            ga.columns += gb.columns
            ga.rows += gb.rows
            ga.biases += gb.biases
            ga.failed = ga.failed or gb.failed
            gb.parent = lo
        return min(a, b)

    def fail(self, g: int, why: str) -> None:
        g = self.root(g)
        if not self.groups[g].failed:
            self.groups[g].failed = why

    # ---- the walk ----------------------------------------------------------------------------
    def run(self) -> TensorSplit:
        for eqn, ins, outs in self.flat:
            for v in outs:
                self.producer[v] = (eqn, ins)
            self.step(eqn, ins, outs)
        for v in self.outputs:
            if not isinstance(v, Literal) and v in self.tag:
                self.fail(self.tag[v][0], "its output features reach the loss without a second "
                          "matmul (a classifier head)")
        for v in self.loops.carried:
            if v in self.tag:
                self.fail(self.tag[v][0], "its output features are carried out of a scan's trip "
                          "before any second matmul")
        return self.result()

    def weight(self, v):
        """``(param, dims)`` when ``v`` is a parameter, a cast / transpose of one, or one scan
        trip's slice of one (a stacked layer's weights: the slice's dims are the parameter's
        less its leading one)."""
        if isinstance(v, Literal):
            return None
        if v in self.loops.slices:
            w = self.weight(self.loops.slices[v])
            if w is None:
                return None
            self.trips[w[0]] = self.loops.trips[v]
            return w[0], w[1][1:]
        return self.view.get(v)

    def step(self, eqn, ins: list, outs: list) -> None:
        name = eqn.primitive.name
        for i, v in enumerate(ins):
            src = self.weight(v)[0] if self.weight(v) is not None else (
                None if isinstance(v, Literal) else self.derived.get(v))
            if src is None:
                continue
            if name in _VIEWS | _SHAPES:
                self.derived.update((o, src) for o in outs)
            else:
                self.uses[src].append((name, eqn, i))
        if name in _VIEWS and len(ins) == 1 and self.weight(ins[0]) is not None:
            p, dims = self.weight(ins[0])
            if name == "transpose":
                dims = tuple(dims[j] for j in eqn.params["permutation"])
            self.view[outs[0]] = (p, dims)
        tagged = [(i, self.tag[v]) for i, v in enumerate(ins)
                  if not isinstance(v, Literal) and v in self.tag]
        if name == "dot_general":
            return self.dot(eqn, ins, outs, tagged)
        if not tagged:
            return
        groups = [g for _, (g, _) in tagged]
        if name in _KEEP:
            dims = {d for _, (_, d) in tagged}
            g = groups[0]
            for other in groups[1:]:
                g = self.union(g, other)
            if len(dims) > 1:
                return self.fail(g, "split features meet other split features along another "
                                 "dimension")
            d = dims.pop()
            for v in ins:
                self.maybe_bias(g, v, d)
            self.tag[outs[0]] = (g, d)
            return
        g, d = tagged[0][1]
        for other in groups[1:]:
            g = self.union(g, other)
        out_dim = self.moved(eqn, ins, d)
        if out_dim is None:
            return self.fail(g, f"its output features are {_VERB.get(name, 'used by ' + name)} "
                             f"({_where(eqn)}) before any second matmul (a classifier head, a "
                             "norm or a loss)")
        for v in outs:
            self.tag[v] = (g, out_dim)

    def moved(self, eqn, ins, d: int):
        """Where a split dimension goes through a shape-only or reducing op (None: it cannot)."""
        name, p = eqn.primitive.name, eqn.params
        src, dst = tuple(ins[0].aval.shape), tuple(eqn.outvars[0].aval.shape)
        if name == "broadcast_in_dim":
            return p["broadcast_dimensions"][d]
        if name == "transpose":
            return p["permutation"].index(d)
        if name == "squeeze":
            return None if d in p["dimensions"] else d - sum(x < d for x in p["dimensions"])
        if name == "reshape":
            extent = math.prod(src[d:])
            for k in range(len(dst)):
                if math.prod(dst[k:]) == extent and dst[k] % self.m == 0:
                    return k
            return None
        if name in ("reduce_sum", "reduce_max", "reduce_min", "argmax", "argmin"):
            axes = tuple(p["axes"])
            return None if d in axes else d - sum(a < d for a in axes)
        if name in ("slice", "pad", "rev", "concatenate", "split", "dynamic_slice", "stack",
                    "cumsum", "cummax", "cumlogsumexp"):
            along = {"slice": lambda: src[d] != dst[d], "pad": lambda: tuple(
                p["padding_config"][d]) != (0, 0, 0), "rev": lambda: d in p["dimensions"],
                "concatenate": lambda: p["dimension"] == d, "split": lambda: p["axis"] == d,
                "dynamic_slice": lambda: p["slice_sizes"][d] != src[d],
                "stack": lambda: False, "cumsum": lambda: p["axis"] == d,
                "cummax": lambda: p["axis"] == d, "cumlogsumexp": lambda: p["axis"] == d}[name]()
            if along:
                return None
            return d + (d >= p["axis"]) if name == "stack" else d
        return None

    def maybe_bias(self, g: int, v, d: int) -> None:
        """A parameter reshaped and broadcast along the split features into their elementwise op:
        a bias (or a per-feature scale), split with them."""
        while not isinstance(v, Literal) and v not in self.tag and self.weight(v) is None \
                and v in self.producer:
            eqn, ins = self.producer[v]
            name, src, dst = eqn.primitive.name, ins[0].aval.shape, eqn.outvars[0].aval.shape
            if name == "broadcast_in_dim":
                dims = eqn.params["broadcast_dimensions"]
                if d not in dims or src[dims.index(d)] != dst[d]:
                    return
                d = dims.index(d)
            elif name == "reshape":
                k = next((k for k in range(len(src)) if math.prod(src[k:]) == math.prod(dst[d:])
                          and src[k] == dst[d]), None)
                if k is None:
                    return
                d = k
            elif name not in ("convert_element_type", "copy", "copy_p"):
                return
            v = ins[0]
        w = None if isinstance(v, Literal) else self.weight(v)
        if w is not None and v.aval.shape[d] % self.m == 0:
            self.groups[self.root(g)].biases.append((w[0], w[1][d]))

    def dot(self, eqn, ins, outs, tagged) -> None:
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        contract, batch = (lc, rc), (lb, rb)
        free, out_dim = free_dims(eqn), functools.partial(matmul_out_dim, eqn)
        if not tagged:
            return self.column(eqn, ins, outs, free, out_dim)
        if len(tagged) == 2:
            (i, (g1, d1)), (_, (g2, d2)) = tagged
            g = self.union(g1, g2)
            if d1 in batch[0] and d2 == batch[1][batch[0].index(d1)]:
                self.tag[outs[0]] = (g, batch[0].index(d1))
                return
            return self.fail(g, f"a matmul contracts or crosses split features of two values "
                             f"(at {_where(eqn)})")
        side, (g, d) = tagged[0]
        other = ins[1 - side]
        if d in contract[side]:
            w = self.weight(other)
            if w is None:
                return self.fail(g, f"its split features are contracted with an activation (at "
                                 f"{_where(eqn)}), not with a second weight")
            k = contract[1 - side][contract[side].index(d)]
            self.groups[self.root(g)].rows.append((w[0], w[1][k]))
            return
        self.tag[outs[0]] = (g, out_dim(side, d))

    def column(self, eqn, ins, outs, free, out_dim) -> None:
        """A matmul of a weight and a value: a candidate for a column-parallel split."""
        for side in (0, 1):
            w, act = self.weight(ins[side]), ins[1 - side]
            if w is None or self.weight(act) is not None:
                continue
            p, pdims = w
            if p in self.excluded:
                return
            for d in free[side]:
                if ins[side].aval.shape[d] % self.m == 0:
                    self.groups.append(_Group(columns=[(p, pdims[d])]))
                    self.tag[outs[0]] = (len(self.groups) - 1, out_dim(side, d))
                    return
            return

    # ---- the splits --------------------------------------------------------------------------
    def result(self) -> TensorSplit:
        taken: dict = {}
        specs, groups, reasons = {}, [], {}
        for g in self.groups:
            if g.parent is not None:
                continue
            members = list(dict.fromkeys(g.columns + g.rows + g.biases))
            why = g.failed or ("" if g.rows else "no second matmul contracts its split features")
            clash = next((p for p, _ in members if p in taken), None)
            if not why and clash is not None:
                why = f"it pairs with {self.paths[clash]}, which is already split in another pair"
            why = why or self.shared_use(g)
            if why:
                for p, _ in g.columns:
                    reasons.setdefault(p, why)
                first = self.paths[g.columns[0][0]]
                for p, _ in g.rows:
                    reasons.setdefault(p, f"it would be the second matmul of {first}, which is "
                                          f"not split: {why}")
                continue
            for p, d in members:
                taken[p] = d
                spec = [None] * len(p.aval.shape)
                spec[d] = self.axis
                specs[self.paths[p]] = P(*spec)
            groups.append({kind: list(dict.fromkeys(self.paths[p] for p, _ in part))
                           for kind, part in (("column", g.columns), ("row", g.rows),
                                              ("bias", g.biases))})
        replicated = {path: reasons.get(p) or self.excluded.get(p) or self.unused_reason(p)
                      for p, path in self.paths.items() if p not in taken}
        by_path = {path: p for p, path in self.paths.items()}
        rows = sum(self.trips.get(by_path[path], 1) for grp in groups for path in grp["row"])
        return TensorSplit(specs, tuple(groups), replicated, rows)

    def shared_use(self, g: _Group) -> str:
        for p, _ in dict.fromkeys(g.columns + g.rows):
            kinds = {name for name, _, _ in self.uses[p]}
            if kinds - {"dot_general"} or len(self.uses[p]) > 1:
                return (f"the weight {self.paths[p]} is also used by "
                        f"{', '.join(sorted(kinds - {'dot_general'}) or ['another matmul'])} "
                        "(a tied embedding)")
        return ""

    def unused_reason(self, p) -> str:
        kinds = sorted({name for name, _, _ in self.uses[p]})
        if not kinds:
            return "not used by the loss"
        if "dot_general" in kinds:
            if all(not free_dims(eqn)[i] for name, eqn, i in self.uses[p]
                   if name == "dot_general"):
                return "it scales features (a matmul without output features of its own)"
            return (f"no output dimension of its matmul divides by model={self.m}, or its "
                    "input is already split")
        if "conv_general_dilated" in kinds:
            return "a convolution kernel (Megatron splits matmuls)"
        return f"not a matmul weight (used by {', '.join(kinds)})"


_VERB = {"reduce_sum": "summed", "reduce_max": "reduced (max)", "reduce_min": "reduced (min)",
         "argmax": "reduced (argmax)", "gather": "gathered", "sort": "sorted",
         "concatenate": "concatenated", "slice": "sliced", "reshape": "reshaped across heads",
         "conv_general_dilated": "convolved", "scan": "carried into a loop",
         "cond": "used in a branch", "while": "carried into a loop", "squeeze": "squeezed"}


def _where(eqn) -> str:
    from mlsys_jax.parallel.shard.batch.axis import where_of

    return where_of(eqn) or eqn.primitive.name
