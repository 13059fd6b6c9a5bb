"""One stage of a split as JAX functions of flat values: forward, vjp, residuals, estimated time.

A stage's inputs are the parameter leaves it reads (a rows leaf as its slice), the boundary
values it receives and the microbatch's leaves; its outputs are the boundary values it sends (the
last stage: the loss). Only floating-point values carry cotangents: an integer value crossing a
boundary is sent forward and never back.

Without recomputation, the backward uses the forward's *residuals* (the leaves of JAX's vjp
closure, a pytree): those that are the stage's own inputs (its parameters, received activations,
the microbatch) are read again instead of being stashed per microbatch, constants are kept once,
and only the rest is stashed (:class:`Residuals`).
"""
from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from mlsys_jax.compat import Tracer
from mlsys_jax.parallel.pipe.split import Split, run_part


def is_float(aval) -> bool:
    """Whether an abstract value is floating (carries a gradient)."""
    return jnp.issubdtype(aval.dtype, jnp.inexact)


@dataclass(frozen=True)
class StageIO:
    """The avals a stage reads and writes."""

    leaves: tuple          # parameter leaf indices, in order
    leaf_avals: tuple      # as the stage holds them (a rows leaf: its slice)
    in_avals: tuple        # received boundary values
    out_avals: tuple       # sent boundary values (the last stage: the loss)
    batch_avals: tuple     # one microbatch's leaves

    @property
    def float_in(self) -> tuple:
        """Positions of the stage's floating inputs (the ones a backward sends back)."""
        return tuple(i for i, a in enumerate(self.in_avals) if is_float(a))

    @property
    def float_out(self) -> tuple:
        """Positions of the stage's floating outputs (the ones gradients arrive for)."""
        return tuple(i for i, a in enumerate(self.out_avals) if is_float(a))


def stage_io(split: Split, s: int) -> StageIO:
    """Stage ``s``'s inputs and outputs: the parameter leaves it reads and the values crossing its cuts."""
    jaxpr, part = split.closed.jaxpr, split.parts[s]
    index = {v: i for i, v in enumerate(jaxpr.invars[:split.n_params])}
    leaves = sorted(index[v] for v in set(part.whole_reads) | set(part.row_reads))
    avals = []
    for i in leaves:
        a = jaxpr.invars[i].aval
        v = jaxpr.invars[i]
        if v in part.row_reads and v not in part.whole_reads and \
                split.placements[i].kind == "rows":
            lo, hi = part.row_reads[v]
            a = a.update(shape=(hi - lo,) + a.shape[1:])
        avals.append(a)
    return StageIO(tuple(leaves), tuple(avals), tuple(split.avals[v] for v in part.inputs),
                   tuple(split.avals[v] if v in split.avals else v.aval for v in part.outputs),
                   tuple(v.aval for v in jaxpr.invars[split.n_params:]))


def differentiable(split: Split, s: int, io: StageIO, acts, batch, unrolled: bool = False):
    """``g(leaf_vals, float_acts) -> (float_outs, other_outs)``: the stage with its integer
    inputs and the microbatch closed over (for ``jax.vjp(g, ..., has_aux=True)``)."""
    fin, fout = io.float_in, io.float_out

    def g(leaf_vals, float_acts):
        full = list(acts)
        for i, x in zip(fin, float_acts):
            full[i] = x
        outs = run_part(split, s, dict(zip(io.leaves, leaf_vals)), full, batch, unrolled)
        return (tuple(outs[i] for i in fout),
                tuple(o for i, o in enumerate(outs) if i not in fout))
    return g


@dataclass(frozen=True)
class Residuals:
    """How a stage's vjp residuals are kept: ``kinds[i]`` is ``("input", j)`` (the j-th primal
    input, re-read), ``("const", value)`` or ``("saved", k)`` (the k-th stashed value)."""

    treedef: object
    kinds: tuple
    saved_avals: tuple


def forward_with_vjp(split: Split, s: int, io: StageIO, leaf_vals, acts, batch):
    """``(float_outs, other_outs, residual leaves, treedef)`` of the stage's forward."""
    g = differentiable(split, s, io, acts, batch)
    float_acts = tuple(acts[i] for i in io.float_in)
    outs, vjp, other = jax.vjp(g, tuple(leaf_vals), float_acts, has_aux=True)
    leaves, treedef = jax.tree.flatten(vjp)
    return outs, other, leaves, treedef


def residuals_of(split: Split, s: int, io: StageIO) -> Residuals:
    """Classify the residuals by tracing the stage's forward once (abstractly)."""
    found = {}

    def probe(leaf_vals, acts, batch):
        outs, other, leaves, treedef = forward_with_vjp(split, s, io, leaf_vals, acts, batch)
        primal = list(leaf_vals) + [acts[i] for i in io.float_in] + list(batch)
        kinds, saved = [], []
        for r in leaves:
            j = next((k for k, p in enumerate(primal) if r is p), None)
            if j is not None:
                kinds.append(("input", j))
            elif not isinstance(r, Tracer):
                kinds.append(("const", r))
            else:
                kinds.append(("saved", len(saved)))
                saved.append(jax.typeof(r))
        found.update(treedef=treedef, kinds=tuple(kinds), saved=tuple(saved))
        return outs

    structs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False))
               for a in io.leaf_avals + io.in_avals + io.batch_avals]
    n, m = len(io.leaf_avals), len(io.in_avals)
    jax.make_jaxpr(lambda *a: probe(a[:n], a[n:n + m], a[n + m:]))(*structs)
    return Residuals(found["treedef"], found["kinds"], found["saved"])


def rebuild_vjp(res: Residuals, saved, leaf_vals, acts, batch, io: StageIO):
    """The stage's vjp function from stashed residuals and its inputs read again."""
    primal = list(leaf_vals) + [acts[i] for i in io.float_in] + list(batch)
    leaves = []
    for kind, x in res.kinds:
        leaves.append(primal[x] if kind == "input" else x if kind == "const" else saved[x])
    return jax.tree.unflatten(res.treedef, leaves)


def estimated_time_us(split: Split, s: int, hw) -> float:
    """The cost model's estimate (µs) of stage s's forward and backward for one microbatch."""
    from mlsys_jax.cost import estimate

    io = stage_io(split, s)

    def fwd_bwd(leaf_vals, acts, batch):
        g = differentiable(split, s, io, acts, batch, unrolled=True)
        outs, vjp, _ = jax.vjp(g, tuple(leaf_vals), tuple(acts[i] for i in io.float_in),
                               has_aux=True)
        return vjp(tuple(jnp.ones_like(o) for o in outs))

    structs = [[jax.ShapeDtypeStruct(a.shape, a.dtype) for a in group]
               for group in (io.leaf_avals, io.in_avals, io.batch_avals)]
    return estimate(jax.make_jaxpr(fwd_bwd)(*structs), hw=hw).time_us
