"""The batch axis through each primitive: the rules of :func:`batch_axis.follow_batch`.

A rule maps the states of an equation's inputs (``Rows``, ``Summed``, ``Stat``, ``Free``,
``Mixed``) to the states of its outputs, recording a ``Mixing`` where examples meet. Shapes are
JAX's own (every elementwise operand has the output's shape, or is a scalar), so dimensions line
up by index. A primitive without a rule that sees the batch is recorded as *unfollowed*: the
structural verdict is then inconclusive and the numbers decide.
"""
from __future__ import annotations

import math
from dataclasses import replace

from mlsys_jax.ir import primitives as prims
from mlsys_jax.parallel.shard.batch.axis import (BatchWalk, Free, Mixed, Rows, Stat, Summed,
                                                 call_body, free_of, state_of)
from mlsys_jax.parallel.shard.batch import uniform
from mlsys_jax.parallel.shard.batch.flags import Flags
from mlsys_jax.parallel.shard.batch.moves import Moves
from mlsys_jax.parallel.shard.batch.scatter import Scatters
from mlsys_jax.parallel.shard.matmul_dims import out_dim

# Value-preserving or additive: a linear function of a batch-wide sum stays one.
_LINEAR = frozenset({"add", "add_any", "sub", "neg", "convert_element_type", "copy", "copy_p",
                     "reduce_precision", "stop_gradient", "real", "imag", "conj"})
_IDENTITY = prims.PLACEMENT | {"optimization_barrier", "name", "pvary", "pcast", "random_clone",
                               "checkpoint_name"}
_SHAPE = frozenset({"broadcast_in_dim", "reshape", "squeeze", "transpose"})
_WINDOWED = frozenset({"reduce_window_sum", "reduce_window_max", "reduce_window_min",
                       "reduce_window", "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"})
_RANDOM = prims.RNG_BITS | prims.RNG_KEYS


def _shape(v) -> tuple:
    return tuple(getattr(v.aval, "shape", ()))


def _all_dims(v) -> frozenset:
    return frozenset(d for d, s in enumerate(_shape(v)) if s > 1)


class Rules(Moves, Scatters, Flags):
    """Applies the rules over a jaxpr and its nested bodies, recording into ``walk``."""

    def __init__(self, walk, synced_axes: tuple):
        self.walk, self.synced = walk, synced_axes

    # ---- jaxprs ----------------------------------------------------------------------------
    def body(self, jaxpr, env: dict, prefix: str, top: bool = False) -> list:
        for i, eqn in enumerate(jaxpr.eqns):
            path = f"{prefix}{i}"
            ins = [state_of(env, v) for v in eqn.invars]
            outs = self.eqn(eqn, ins, path)
            for v, s in zip(eqn.outvars, outs):
                env[v] = s
                if top:
                    self.walk.producers[v] = (eqn, path)
                    if isinstance(s, Summed) and self.walk.sums[s.origin].top_var is None:
                        self.walk.sums[s.origin] = replace(self.walk.sums[s.origin], top_var=v)
        outs = [state_of(env, v) for v in jaxpr.outvars]
        if top and outs and isinstance(outs[0], Stat):   # the loss itself is the statistic
            st, s = outs[0], self.walk.sums[outs[0].origin]
            detail = (f"the loss is divided by a batch-wide sum ({s.primitive} at {s.path})"
                      if st.kind == "normaliser" else
                      f"the loss is a nonlinear function of a batch-wide sum ({s.primitive} at "
                      f"{s.path})")
            outs[0] = self.walk.record(st.kind, st.eqn, st.path, detail, origin=st.origin,
                                       synced=st.synced)
        return outs

    def call(self, jaxpr, consts, ins: list, prefix: str) -> list:
        env = {v: Free(_all_dims(v)) for v in jaxpr.constvars}
        env.update(zip(jaxpr.invars, ins))
        return self.body(jaxpr, env, prefix)

    # ---- one equation ----------------------------------------------------------------------
    def eqn(self, eqn, ins: list, path: str) -> list:
        name, n = eqn.primitive.name, len(eqn.outvars)
        mixed = next((s for s in ins if isinstance(s, Mixed)), None)
        if mixed is not None:
            return [mixed] * n
        if all(isinstance(s, Free) for s in ins) and name not in prims.CALLS | prims.CONTROL:
            return self.free(eqn, ins)
        if name in prims.ELEMENTWISE or name in ("clamp", "threefry2x32"):
            return [self.elementwise(eqn, ins, path)] * n
        if name in _IDENTITY:
            return list(ins[:n])
        handler = getattr(self, "p_" + name, None)
        if handler is not None:
            out = handler(eqn, ins, path)
            return out if isinstance(out, list) else [out] * n
        if name in prims.TRANSPARENT_CALLS and call_body(eqn) is not None:
            b = call_body(eqn)
            self.walk.calls.append(eqn)
            try:
                return self.call(b.jaxpr, b.consts, ins, f"{path}/{b.label}/")
            finally:
                self.walk.calls.pop()
        if name in _RANDOM:
            return [self.keys(eqn, ins, path)] * n
        if name in ("reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
                    "argmax", "argmin"):
            return [self.reduce(eqn, ins[0], path, linear=False)]
        if name in _WINDOWED:
            return [self.windowed(eqn, ins, path)] * n
        return [self.walk.record("unfollowed", eqn, path, f"no batch-axis rule for {name}")] * n

    def free(self, eqn, ins: list) -> list:
        """States of outputs of an equation whose inputs are all free of the batch."""
        name = eqn.primitive.name
        random = name in prims.RNG_BITS or any(s.random for s in ins)
        out = []
        for v in eqn.outvars:
            if name == "iota":
                d = eqn.params["dimension"]
                varying = frozenset({d}) if _shape(v)[d] > 1 else frozenset()
            elif name in prims.ELEMENTWISE:
                varying = frozenset().union(*(s.varying for s in ins if _shape(v)))
                varying = varying if len(_shape(v)) else frozenset()
            elif name == "broadcast_in_dim":
                dims, src = eqn.params["broadcast_dimensions"], _shape(eqn.invars[0])
                varying = frozenset(dims[d] for d in ins[0].varying
                                    if src[d] == _shape(v)[dims[d]])
            elif name == "transpose":
                perm = eqn.params["permutation"]
                varying = frozenset(perm.index(d) for d in ins[0].varying)
            elif uniform.varying(eqn, ins, v) is not None:
                varying = uniform.varying(eqn, ins, v)
            elif not any(s.varying for s in ins) and name not in prims.RNG_BITS:
                varying = frozenset()
            else:
                varying = _all_dims(v)
            out.append(Free(varying, random))
        return out

    def elementwise(self, eqn, ins: list, path: str):
        rows = [s for s in ins if isinstance(s, Rows)]
        sums = [s for s in ins if isinstance(s, (Summed, Stat))]
        frees = [(s, v) for s, v in zip(ins, eqn.invars) if isinstance(s, Free)]
        if rows:
            r = rows[0]
            if any(x != r for x in rows):
                return self.walk.record("pairs", eqn, path, "values of different examples are "
                                        "combined elementwise (the batch against itself)")
            if sums:
                return self.statistic(eqn, path, sums[0], all(s.synced for s in sums), r)
            for s, v in frees:
                if len(_shape(v)) and r.dim in s.varying:
                    what = ("random numbers drawn for each position of the batch (a PRNG key "
                            "fixed inside the loss)" if s.random else
                            "values that vary along the batch axis but do not come from the batch")
                    return self.walk.record("position", eqn, path, f"each example is combined "
                                            f"with {what}", random=s.random)
            return r
        if sums:
            return self.on_sums(eqn, ins, path, sums)
        return Free(frozenset().union(*(s.varying for s, _ in frees)),
                    any(s.random for s, _ in frees))

    def statistic(self, eqn, path: str, s, synced: bool, rows=None):
        """A batch-wide sum or statistic meets examples. The record names the equation that
        summed the examples, and where the result is used. Synchronised across devices, the mesh
        computes the same per-example values: the rows go on (``rows``)."""
        origin = self.walk.sums[s.origin]
        used = ", ".join(p for p in (f"{eqn.primitive.name} at {path}", self.walk.where(eqn)) if p)
        mixed = self.walk.record(
            "statistic", origin.eqn, origin.path, f"a batch statistic (a {origin.primitive} over "
            f"the batch axis) is used per example ({used})", origin=s.origin, synced=synced,
            where=origin.where)
        return rows if synced and rows is not None else mixed

    def on_sums(self, eqn, ins: list, path: str, sums: list):
        """Elementwise work on batch-wide sums (and free values): linear keeps ``Summed``."""
        name = eqn.primitive.name
        synced = all(s.synced for s in sums)
        stat = next((s for s in sums if isinstance(s, Stat)), None)
        if stat is not None:
            return replace(stat, synced=synced)
        first = sums[0]
        linear = (name in _LINEAR or (name == "mul" and len(sums) == 1)
                  or (name == "div" and len(sums) == 1 and isinstance(ins[0], Summed)))
        if linear:
            return Summed(first.origin, synced)
        if name == "div" and isinstance(ins[1], Summed):
            return Stat(ins[1].origin, synced, "normaliser", eqn, path)
        return Stat(first.origin, synced, "nonlinear", eqn, path)

    # ---- reductions and the shape of the batch ----------------------------------------------
    def reduce(self, eqn, s, path: str, linear: bool, axes=None):
        """``s`` reduced over ``axes`` (the equation's own by default): a batch-wide sum when
        linear and along the batch, a recorded reduction when not linear."""
        axes = tuple(eqn.params["axes"]) if axes is None else axes
        if isinstance(s, (Summed, Stat)):
            return s if linear or isinstance(s, Stat) else Stat(
                s.origin, s.synced, "nonlinear", eqn, path)
        if s.dim in axes:
            if linear:
                return self.walk.new_sum(eqn, path)
            return self.walk.record("reduction", eqn, path, f"{eqn.primitive.name} along the "
                                    "batch axis")
        return Rows(s.dim - sum(a < s.dim for a in axes), s.inner)

    def p_reduce_sum(self, eqn, ins, path):
        return self.reduce(eqn, ins[0], path, linear=True)

    def windowed(self, eqn, ins: list, path: str):
        s = ins[0]
        if not isinstance(s, Rows):
            return s if isinstance(s, (Summed, Stat)) else Free(_all_dims(eqn.outvars[0]))
        p = eqn.params
        if "axis" in p:
            along = p["axis"] == s.dim
        else:
            pad = p.get("padding", ())
            along = (p["window_dimensions"][s.dim] != 1 or p["window_strides"][s.dim] != 1
                     or (pad and tuple(pad[s.dim]) != (0, 0)))
        if along:
            return self.walk.record("order", eqn, path, f"{eqn.primitive.name} runs along the "
                                    "batch axis")
        return s

    def p_broadcast_in_dim(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows):
            return Rows(eqn.params["broadcast_dimensions"][s.dim], s.inner)
        return s

    def p_transpose(self, eqn, ins, path):
        s = ins[0]
        return Rows(eqn.params["permutation"].index(s.dim), s.inner) if isinstance(s, Rows) else s

    def p_squeeze(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows):
            return Rows(s.dim - sum(d < s.dim for d in eqn.params["dimensions"]), s.inner)
        return s

    def p_reshape(self, eqn, ins, path):
        s = ins[0]
        if not isinstance(s, Rows):
            return s
        src, dst = _shape(eqn.invars[0]), _shape(eqn.outvars[0])
        stride = s.inner * math.prod(src[s.dim + 1:])   # flat stride of the example index
        b = self.walk.batch
        for d in range(len(dst)):
            after = math.prod(dst[d + 1:])
            if stride % after == 0 and dst[d] % ((stride // after) * b) == 0:
                return Rows(d, stride // after)
        return self.walk.record("unfollowed", eqn, path, f"reshape {src} -> {dst} splits the "
                                "batch axis over several dimensions")

    def p_dot_general(self, eqn, ins, path):
        (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
        lhs, rhs = ins
        if any(isinstance(s, (Summed, Stat)) for s in ins):
            rows = next((s for s in ins if isinstance(s, Rows)), None)
            sums = [s for s in ins if isinstance(s, (Summed, Stat))]
            if rows is not None:   # (the rows' dimension in the output: the matmul's rule)
                return self.statistic(eqn, path, sums[0], False)
            if len(sums) == 1 and isinstance(sums[0], Summed):
                return sums[0]
            return Stat(sums[0].origin, all(s.synced for s in sums), "nonlinear", eqn, path)
        contract, batch = (lc, rc), (lb, rb)
        if isinstance(lhs, Rows) and isinstance(rhs, Rows):
            if lhs.dim in lc and rhs.dim == rc[lc.index(lhs.dim)] and lhs.inner == rhs.inner:
                return self.walk.new_sum(eqn, path)
            if lhs.dim in lb and rhs.dim == rb[lb.index(lhs.dim)] and lhs.inner == rhs.inner:
                return Rows(lb.index(lhs.dim), lhs.inner)
            return self.walk.record("pairs", eqn, path, "a matmul pairs examples with each "
                                    "other (the batch contracted against itself)")
        side = 0 if isinstance(lhs, Rows) else 1
        r, other = ins[side], ins[1 - side]
        if r.dim in contract[side]:
            k = contract[1 - side][contract[side].index(r.dim)]
            if k in other.varying:
                return self.walk.record("position", eqn, path, "examples are summed with "
                                        "weights that depend on their position in the batch")
            return self.walk.new_sum(eqn, path)
        if r.dim in batch[side]:
            k = batch[1 - side][batch[side].index(r.dim)]
            if k in other.varying:
                return self.walk.record("position", eqn, path, "each example meets a "
                                        "different slice of a batch-independent operand")
        return Rows(out_dim(eqn, side, r.dim), r.inner)

    def p_conv_general_dilated(self, eqn, ins, path):
        lhs_spec, _, out_spec = eqn.params["dimension_numbers"]
        lhs, rhs = ins
        if any(isinstance(s, (Summed, Stat)) for s in ins):
            return self.statistic(eqn, path, next(s for s in ins if isinstance(s, (Summed, Stat))),
                                  False)
        if isinstance(rhs, Rows) or lhs.dim != lhs_spec[0] \
                or eqn.params.get("batch_group_count", 1) != 1:
            return self.walk.record("pairs", eqn, path, "a convolution runs across examples")
        return Rows(out_spec[0], lhs.inner)


def follow_batch(closed, batch_invars: set, batch: int, synced_axes=(), axes=None) -> BatchWalk:
    """Walk ``closed`` (a loss's ClosedJaxpr) with the invars in ``batch_invars`` holding
    examples (``batch`` rows along dimension 0); other inputs and constants are free.

    ``synced_axes``: axis names of collectives that complete a sum across the data axis;
    ``axes``: ``{invar: dimension}`` holding the examples, else found (:func:`time_major`).
    """
    if axes is None:
        walk = _walk(closed, {v: 0 for v in batch_invars}, batch, synced_axes)
        other = time_major(closed, batch_invars, walk, synced_axes)
        return walk if other is None else other
    sizes = {_shape(v)[a] for v, a in axes.items()}
    return _walk(closed, axes, sizes.pop() if len(sizes) == 1 else batch, synced_axes)


def _walk(closed, axes: dict, batch: int, synced_axes) -> BatchWalk:
    walk = BatchWalk(batch, axes=dict(axes))
    jaxpr = closed.jaxpr
    env = {v: free_of(v) for v in jaxpr.constvars}
    for v in jaxpr.invars:
        env[v] = Rows(axes[v]) if v in axes else free_of(v)
    rules = Rules(walk, tuple(synced_axes))
    outs = rules.body(jaxpr, env, "", top=True)
    walk.output = outs[0] if outs else Free()
    return walk


def _recurs_over_rows(walk) -> bool:
    """The only mixing is a scan carrying values along dimension 0 of the batch."""
    mixing = [m for m in walk.mixing if not m.synced]
    return bool(mixing) and all(m.kind == "order" and m.primitive == "scan" for m in mixing)


def time_major(closed, batch_invars: set, walk, synced_axes=()):
    """The walk with the examples on dimension 1 of every batch leaf, when the loss recurs over
    dimension 0 (a scan over time of time-major ``[T, B, ...]`` leaves) and nothing mixes the
    examples along dimension 1; else None. A scan carrying values from one example to the next
    is rare; a scan over time is every time-major RNN."""
    if not batch_invars or not _recurs_over_rows(walk):
        return None
    shapes = [_shape(v) for v in batch_invars]
    if any(len(s) < 2 for s in shapes) or len({s[1] for s in shapes}) != 1 or shapes[0][1] < 2:
        return None
    other = _walk(closed, {v: 1 for v in batch_invars}, shapes[0][1], synced_axes)
    if any(not m.synced for m in other.mixing):
        return None
    return other
