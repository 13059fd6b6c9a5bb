"""The optimizer's per-leaf work, batched across leaves.

optax applies one function to every leaf (``jax.tree.map``), so its traced update repeats the
same chain of elementwise operations once per leaf: Adam's twenty or so for each of a small
transformer's 130 leaves, every one compiled in every stage's branch. :func:`chain_groups`
finds the chains — per leaf, the elementwise equations linked by that leaf's arrays — and groups
those that are the same program up to the leaf's shape (same primitives, params, literals and
scalar inputs); :func:`run_position` runs one position of a group once, on the concatenation
of its leaves' values, raveled. Elementwise work computes each element alone, so every value is
the one the leaf-by-leaf chains compute; reductions (a norm's sums) are never batched: each
leaf's reduction reads its own slice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
from jax import lax

from mlsys_jax.compat import Literal, bind_equation
from mlsys_jax.ir.primitives import ELEMENTWISE
from mlsys_jax.parallel.pipe.units import reads

RELABELS = frozenset({"reshape", "squeeze", "expand_dims"})  # no data moves in a raveled world
SHAPE_PARAMS = frozenset({"shape", "new_sizes", "dimensions", "sharding"})


@dataclass(frozen=True)
class ChainGroup:
    """Leaves running one chain: ``chains[m][k]`` is member m's k-th equation, ``inputs[m]``
    its non-scalar inputs from outside the chain (in first-use order), ``sizes[m]`` its
    element count."""

    chains: tuple
    inputs: tuple
    sizes: tuple


def _big(v) -> bool:
    return not isinstance(v, Literal) and v.aval.shape != ()


def _batchable(e) -> bool:
    name = e.primitive.name
    if e.effects or not (name in ELEMENTWISE or name in RELABELS or name == "broadcast_in_dim"):
        return False
    if not e.outvars or not all(_big(v) for v in e.outvars):
        return False
    n = math.prod(e.outvars[0].aval.shape)
    if n == 0 or any(math.prod(v.aval.shape) != n for v in reads(e) if _big(v)):
        return False
    if name == "broadcast_in_dim":
        return all(not _big(v) for v in e.invars)  # a scalar filling the leaf's shape
    return name != "reshape" or e.params.get("dimensions") is None


def _components(eqns, picked) -> dict:
    """Union the non-scalar values of the picked equations: one component per leaf chain."""
    parent: dict = {}

    def find(x):
        while parent.setdefault(x, x) is not x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x
    for i in picked:
        vs = [v for v in reads(eqns[i]) if _big(v)] + list(eqns[i].outvars)
        for v in vs[1:]:
            a, b = find(vs[0]), find(v)
            if a is not b:
                parent[a] = b
    comps: dict = {}
    for i in picked:
        comps.setdefault(find(eqns[i].outvars[0]), []).append(i)
    return comps


def _signature(eqns, literals, chain):
    """The chain as a program up to shapes, and its outside non-scalar inputs."""
    local, outside, entries = {}, [], []
    for k, i in enumerate(chain):
        e, ins = eqns[i], []
        for j, v in enumerate(e.invars):
            if isinstance(v, Literal):
                lit = literals(i, j)
                ins.append(("lit", repr(lit.val), str(lit.aval.dtype), lit.aval.weak_type))
            elif v in local:
                ins.append(local[v])
            elif not _big(v):
                ins.append(("shared", id(v)))  # the same scalar for every leaf
            else:
                if v not in outside:
                    outside.append(v)
                ins.append(("outside", outside.index(v)))
        params = tuple(sorted((p, repr(x)) for p, x in e.params.items() if p not in SHAPE_PARAMS))
        entries.append((e.primitive.name, params, tuple(ins),
                        tuple((str(o.aval.dtype), o.aval.weak_type) for o in e.outvars)))
        for j, o in enumerate(e.outvars):
            local[o] = ("local", k, j)
    return tuple(entries), outside


def chain_groups(jaxpr, literals) -> list[ChainGroup]:
    """Groups of two or more leaves whose chains are one program (``literals(i, j)``: the
    literal evaluated as equation i's input j)."""
    eqns = jaxpr.eqns
    made = {v: i for i, e in enumerate(eqns) for v in e.outvars}
    picked = [i for i, e in enumerate(eqns) if _batchable(e)]
    by_signature: dict = {}
    for chain in _components(eqns, picked).values():
        sig, outside = _signature(eqns, literals, chain)
        by_signature.setdefault(sig, []).append((chain, outside))
    groups = []
    for members in by_signature.values():
        if len(members) < 2:
            continue
        chains = tuple(tuple(c) for c, _ in members)
        # every member's outside inputs must exist where the group runs each position: at the
        # earliest member's equation of that position
        first = [min(c[k] for c in chains) for k in range(len(chains[0]))]
        if any(made.get(v, -1) >= first[0] for _, outside in members for v in outside):
            continue
        if any(made.get(v, -1) >= first[k] for k in range(len(first)) for c in chains
               for v in reads(eqns[c[k]]) if not _big(v)):
            continue  # a scalar input made after the group would run
        groups.append(ChainGroup(chains, tuple(tuple(o) for _, o in members),
                                 tuple(math.prod(eqns[c[0]].outvars[0].aval.shape)
                                       for c in chains)))
    return groups


def run_position(group: ChainGroup, k: int, eqns, literals, env: dict, done: dict) -> None:
    """Run position k of ``group`` once on the raveled concatenation of its members' values and
    give each member's outputs their slices (``done[(id(group), k)]``: the batched outputs)."""
    e0 = eqns[group.chains[0][k]]
    n = sum(group.sizes)
    invals = []
    for j, v in enumerate(e0.invars):
        if isinstance(v, Literal):
            invals.append(literals(group.chains[0][k], j).val)
            continue
        kind = _input_kind(group, k, j, eqns)
        if kind[0] == "local":
            invals.append(done[(id(group), kind[1])][kind[2]])
        elif kind[0] == "shared":
            invals.append(env[v])
        else:
            invals.append(jnp.concatenate([jnp.ravel(env[group.inputs[m][kind[1]]])
                                           for m in range(len(group.chains))]))
    name = e0.primitive.name
    if name in RELABELS:
        outs = [invals[0]]
    elif name == "broadcast_in_dim":
        outs = [lax.broadcast_in_dim(invals[0], (n,), ())]
    else:
        outs = bind_equation(e0, invals)
    done[(id(group), k)] = outs
    start = 0
    for m, size in enumerate(group.sizes):
        for o, var in zip(outs, eqns[group.chains[m][k]].outvars):
            env[var] = o[start: start + size].reshape(var.aval.shape)
        start += size


def _input_kind(group: ChainGroup, k: int, j: int, eqns) -> tuple:
    """Where input j of position k comes from: ``("local", k', j')``, ``("shared",)`` or
    ``("outside", index)`` (the same for every member, by the signature)."""
    chain = group.chains[0]
    v = eqns[chain[k]].invars[j]
    for kk in range(k):
        outs = eqns[chain[kk]].outvars
        if v in outs:
            return ("local", kk, outs.index(v))
    if not _big(v):
        return ("shared",)
    return ("outside", group.inputs[0].index(v))
