"""Evaluating a jaxpr op by op, into every nested body (how the fuzzer judges a rewrite bitwise).

Call-like equations (jit, remat, custom_jvp/vjp) run their bodies equation by equation, cond picks
its branch on the host, scan and while loop in Python. Every primitive then runs as JAX's own
cached single-op executable, so (1) no XLA fusion can blur a bitwise comparison, and (2) random
programs share compiled kernels — a campaign compiles each (primitive, shape, params) once instead
of every program's nested bodies. Data moves and correctly rounded arithmetic skip the kernel:
NumPy gives the same bits (:mod:`mlsys_jax.ir.numpy_rules`), without a compile per new shape.

Derivatives are traced first (``jax.make_jaxpr`` of the VJP or JVP, which applies custom rules),
then evaluated the same way.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, bind_equation, jaxpr_as_fun
from mlsys_jax.ir import numpy_rules
from mlsys_jax.ir.interpret import eval_jaxpr
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.ir.walk import bodies


def eval_open(jaxpr, consts, args) -> list:
    """The foundation's interpreter, with every equation evaluated by :func:`_eval_eqn`."""
    return eval_jaxpr(jaxpr, consts, *args, handler=_eval_eqn)


def _closed(c, args):
    return eval_open(c.jaxpr, c.consts, args)


def _eval_eqn(eqn, invals) -> list:
    name, p = eqn.primitive.name, eqn.params
    if name in TRANSPARENT_CALLS:
        inner = bodies(eqn)
        if len(inner) == 1:
            return eval_open(inner[0].jaxpr, inner[0].consts, invals)
    if name == "cond":
        index = int(np.asarray(invals[0]))
        return _closed(p["branches"][index], invals[1:])
    if name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
        while bool(np.asarray(_closed(p["cond_jaxpr"], cconsts + carry)[0])):
            carry = _closed(p["body_jaxpr"], bconsts + carry)
        return carry
    if name == "scan":
        return _scan(p, invals)
    computed = numpy_rules.evaluate(eqn, invals)  # the same bits, no kernel to compile
    return computed if computed is not None else bind_equation(eqn, invals)


def _scan(p, invals) -> list:
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]
    ys = []
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in steps:
        out = _closed(p["jaxpr"], consts + carry + [x[i] for x in xs])
        carry, y = out[:nk], out[nk:]
        ys.append(y)
    if p["reverse"]:
        ys.reverse()
    y_avals = [v.aval for v in p["jaxpr"].jaxpr.outvars[nk:]]
    stacked = [jnp.stack([y[j] for y in ys]) if ys else jnp.zeros((0,) + a.shape, a.dtype)
               for j, a in enumerate(y_avals)]
    return list(carry) + stacked


def evaluate(closed: ClosedJaxpr, *args) -> list:
    """The outputs of ``closed`` on ``args``, op by op (NumPy arrays)."""
    return [np.asarray(x) for x in _closed(closed, list(args))]


def derivative_jaxpr(closed: ClosedJaxpr, mode: str, inputs, probe) -> tuple:
    """(jaxpr, args): the VJP against cotangents ``probe`` or the JVP along tangents ``probe``."""
    fun = jaxpr_as_fun(closed)
    if mode == "vjp":
        cts = [np.asarray(p, v.aval.dtype) for p, v in zip(probe, closed.jaxpr.outvars)]
        f = lambda xs, cs: jax.vjp(fun, *xs)[1](list(cs))  # noqa: E731
    else:
        cts = [np.asarray(p, np.asarray(x).dtype) for p, x in zip(probe, inputs)]
        f = lambda xs, ts: jax.jvp(fun, list(xs), list(ts))[1]  # noqa: E731
    return jax.make_jaxpr(f)(list(inputs), cts), list(inputs) + cts


def derivative(closed: ClosedJaxpr, mode: str, inputs, probe) -> list:
    """VJP (cotangents ``probe``) or JVP (tangents ``probe``) of ``closed``, evaluated op by op."""
    jaxpr, args = derivative_jaxpr(closed, mode, inputs, probe)
    return evaluate(jaxpr, *args)
