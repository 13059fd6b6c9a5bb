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

from mlsys_jax.compat import ClosedJaxpr, Literal, bind_equation, jaxpr_as_fun
from mlsys_jax.ir import numpy_eval, numpy_rules
from mlsys_jax.ir.interpret import eval_jaxpr
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.ir.walk import bodies
from mlsys_jax.ir.widen import bind_params_widened, bind_widened_blocks, literal_value, \
    widen_dtype, widen_value


def eval_open(jaxpr, consts, args, widen: bool = False) -> list:
    """The foundation's interpreter, with every equation evaluated by :func:`eval_equation`
    (``widen``: in float64, ``ir.widen``)."""
    def handler(eqn, invals):
        return eval_equation(eqn, invals, widen)
    if widen:
        return _eval_widened(jaxpr, consts, args)
    return eval_jaxpr(jaxpr, consts, *args, handler=handler)


def _eval_widened(jaxpr, consts, args) -> list:
    """:func:`eval_open` in float64. A value is widened where an equation reads it, not before:
    a contraction's large float32 weights (a factory's parameters) are widened a block at a time
    (``ir.widen.bind_widened_blocks``), and a call's body gets its arguments as they are."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return literal_value(v, True) if type(v) is Literal else env[v]
    for eqn in jaxpr.eqns:
        vals = [read(v) for v in eqn.invars]
        inner = bodies(eqn) if eqn.primitive.name in TRANSPARENT_CALLS else []
        if len(inner) == 1:
            outs = _eval_widened(inner[0].jaxpr, inner[0].consts, vals)
        else:
            outs = bind_widened_blocks(eqn, vals)
            if outs is None:
                outs = eval_equation(eqn, [widen_value(x) for x in vals], True)
        env.update(zip(eqn.outvars, outs))
    return [widen_value(read(v)) for v in jaxpr.outvars]


def _closed(c, args, widen=False):
    return eval_open(c.jaxpr, c.consts, args, widen)


def eval_equation(eqn, invals, widen: bool = False) -> list:
    """One equation's outputs, its bodies run equation by equation; ``widen``: every float in
    float64 (``ir.widen``)."""
    name, p = eqn.primitive.name, eqn.params
    if name in TRANSPARENT_CALLS:
        inner = bodies(eqn)
        if len(inner) == 1:
            return eval_open(inner[0].jaxpr, inner[0].consts, invals, widen)
    if name == "cond":
        index = int(np.asarray(invals[0]))
        return _closed(p["branches"][index], invals[1:], widen)
    if name == "while":
        cn, bn = p["cond_nconsts"], p["body_nconsts"]
        cconsts, bconsts, carry = invals[:cn], invals[cn:cn + bn], invals[cn + bn:]
        while bool(np.asarray(_closed(p["cond_jaxpr"], cconsts + carry, widen)[0])):
            carry = _closed(p["body_jaxpr"], bconsts + carry, widen)
        return carry
    if name == "scan":
        return _scan(p, invals, widen)
    if widen:  # float64 arithmetic without a kernel to compile where NumPy has the primitive
        computed = numpy_eval.evaluate(eqn, invals, widen_dtype(eqn.outvars[0].aval.dtype)) \
            if len(eqn.outvars) == 1 else None
        return computed if computed is not None else bind_params_widened(eqn, invals)
    computed = numpy_rules.evaluate(eqn, invals)  # the same bits, no kernel to compile
    return computed if computed is not None else bind_equation(eqn, invals)


def _scan(p, invals, widen=False) -> list:
    nc, nk, length = p["num_consts"], p["num_carry"], p["length"]
    consts, carry, xs = invals[:nc], invals[nc:nc + nk], invals[nc + nk:]
    ys = []
    steps = range(length - 1, -1, -1) if p["reverse"] else range(length)
    for i in steps:
        out = _closed(p["jaxpr"], consts + carry + [x[i] for x in xs], widen)
        carry, y = out[:nk], out[nk:]
        ys.append(y)
    if p["reverse"]:
        ys.reverse()
    y_avals = [v.aval for v in p["jaxpr"].jaxpr.outvars[nk:]]
    stacked = [jnp.stack([y[j] for y in ys]) if ys else jnp.zeros(
        (0,) + a.shape, np.float64 if widen and jnp.issubdtype(a.dtype, jnp.floating) else a.dtype)
               for j, a in enumerate(y_avals)]
    return list(carry) + stacked


def evaluate(closed: ClosedJaxpr, *args, widen: bool = False) -> list:
    """The outputs of ``closed`` on ``args``, op by op (NumPy arrays); ``widen``: what it computes
    in float64 (every float widened, ``ir.widen``; inside ``jax.enable_x64(True)``)."""
    return [np.asarray(x) for x in _closed(closed, list(args), widen)]


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
