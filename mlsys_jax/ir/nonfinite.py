"""Where a NaN or an infinity first appears in a traced function: its equations evaluated one at a
time on the given arguments (calls entered), the first whose output is not finite while its
inputs are, named by its module and the user's source line.

>>> import jax, jax.numpy as jnp
>>> closed = jax.make_jaxpr(lambda x: jnp.sum(jnp.log(x) * 2))(jnp.ones(3))
>>> found = first_nonfinite(closed, -jnp.ones(3))
>>> found.split()[0], found.endswith("(an input of shape (3,) gives nan)")
('log', True)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import DropVar, Literal, bind_equation
from mlsys_jax.ir import primitives as prims
from mlsys_jax.ir.walk import bodies


def _finite(x) -> bool:
    if not hasattr(x, "dtype") or not jnp.issubdtype(x.dtype, jnp.inexact):
        return True
    return bool(np.all(np.isfinite(np.asarray(x))))


def _describe(eqn, outs) -> str:
    from mlsys_jax.ir.provenance import UNNAMED, user_line

    bad = next(o for o in outs if not _finite(o))
    kind = "nan" if np.any(np.isnan(np.asarray(bad))) else "inf"
    stack = str(getattr(eqn.source_info, "name_stack", "") or "")
    line = user_line(eqn)
    where = ", ".join(p for p in (stack, "" if line == UNNAMED else line) if p)
    shape = tuple(eqn.invars[0].aval.shape) if eqn.invars else ()
    return (f"{eqn.primitive.name}{' at ' + where if where else ''} (an input of shape {shape} "
            f"gives {kind})")


def _walk(jaxpr, consts, args) -> str | None:
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, Literal) else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        found = bodies(eqn)
        if eqn.primitive.name in prims.TRANSPARENT_CALLS and len(found) == 1:
            inner = found[0].jaxpr
            where = _walk(inner, [], invals) if not inner.constvars else None
            if where:
                return where
        outs = bind_equation(eqn, invals)
        if all(_finite(x) for x in invals) and not all(_finite(o) for o in outs):
            return _describe(eqn, outs)
        env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, DropVar))
    return None


def first_nonfinite(closed, *args) -> str | None:
    """The first equation of ``closed`` (on ``args``, flattened) that makes a NaN or an infinity
    from finite inputs, described in a phrase; "an input" when an argument already holds one;
    None when every value is finite."""
    leaves = jax.tree.leaves(args)
    if not all(_finite(x) for x in leaves):
        return "an input (an argument already holds a NaN or an infinity)"
    with jax.disable_jit():
        return _walk(closed.jaxpr, closed.consts, leaves)
