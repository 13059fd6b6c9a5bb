"""``lax.switch`` over per-stage branches, each distinct program compiled once.

Under one SPMD program every device compiles every stage's branch, so the program grows with
the number of stages. Stages are often identical (the middle stages of a transformer: the same
blocks, the same layouts, only their parameters differ, and those are read from the device's own
buffers): :func:`stage_switch` traces each branch, keys its jaxpr by structure
(``ir.structural_hash``: equal for identical programs, constants by value) and switches over the
distinct ones through a per-stage table.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import jaxpr_as_fun
from mlsys_jax.ir import structural_hash


def _struct(x):
    aval = jax.typeof(x)
    return jax.ShapeDtypeStruct(aval.shape, aval.dtype, weak_type=aval.weak_type)


def distinct(fns: Sequence[Callable], operands) -> tuple[list, list, object]:
    """``(table, closed jaxprs, output tree)``: ``table[i]`` is the index of ``fns[i]``'s program
    among the distinct ones, traced at ``operands`` (a pytree of arrays or tracers)."""
    flat, tree = jax.tree.flatten(operands)
    structs = [_struct(x) for x in flat]
    keys, closed, table, out_tree = {}, [], [], None
    for f in fns:
        c, shape = jax.make_jaxpr(lambda *a, f=f: f(*jax.tree.unflatten(tree, a)),
                                  return_shape=True)(*structs)
        out_tree = jax.tree.structure(shape)
        with jax.ensure_compile_time_eval():  # a PRNG key constant is keyed by its data, now
            k = structural_hash(c)
        if k not in keys:
            keys[k] = len(closed)
            closed.append(c)
        table.append(keys[k])
    return table, closed, out_tree


def stage_switch(index, fns: Sequence[Callable], *operands):
    """``lax.switch(index, fns, *operands)`` with identical branches merged."""
    table, closed, out_tree = distinct(fns, operands)
    flat = jax.tree.leaves(operands)
    branches = [lambda *a, c=c: jaxpr_as_fun(c)(*a) for c in closed]
    pick = jnp.asarray(np.asarray(table, np.int32))[index]
    return jax.tree.unflatten(out_tree, lax.switch(pick, branches, *flat))
