"""The least precise float dtype an output's computation passes through.

A model may keep float32 parameters and compute in bfloat16 (flax's ``nn.Dense(dtype=
jnp.bfloat16)``: inputs and kernel cast down, the matmul in bfloat16, its gradient cast back up).
Its gradients are float32 arrays, but their rounding is bfloat16's: a comparison whose tolerance
reads the output's own dtype (float32's eps) calls two correct computations different, and one
that takes the least precise dtype *anywhere* in a program (a float16 side output beside a
float32 head) is too lenient for the outputs that never touch it. So each output gets the dtype
of its own dataflow: every value it is computed from, followed backwards through the jaxpr (and
through the bodies of calls with one body, output by output; a loop's or a branch's bodies count
whole).

``shard`` and the pipeline measure their noise where this is less precise than an output's own
dtype (``parallel/shard/run.py``, ``parallel/pipe/verdict.py``); translation validation checks a
rewrite's rounding in it (``passes/validate.py``).
"""
from __future__ import annotations

import functools
import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.ir.walk import bodies, walk


def float_dtype(dtype):
    """``dtype`` as a NumPy dtype when it is a real float (bfloat16 included), else None."""
    try:
        return _float_dtype(dtype)
    except TypeError:  # (unhashable: asked uncached)
        return _float_dtype.__wrapped__(dtype)


@functools.lru_cache(maxsize=256)  # (JAX's dtype predicates cost microseconds; a region asks
def _float_dtype(dtype):           # for every value's dtype)
    if dtype is None or jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return None
    return np.dtype(dtype) if jnp.issubdtype(dtype, jnp.floating) else None


def eps(dtype) -> float:
    """Machine epsilon of a float dtype (0 for anything else)."""
    d = float_dtype(dtype)
    return 0.0 if d is None else _eps(d)


@functools.lru_cache(maxsize=64)
def _eps(d: np.dtype) -> float:
    return float(jnp.finfo(d).eps)


def coarser(a, b):
    """The less precise of two float dtypes (None: no float)."""
    if a is None or b is None:
        return a if b is None else b
    return a if eps(a) >= eps(b) else b


def coarsest(dtypes):
    """The least precise of some dtypes (non-floats ignored), or None."""
    out = None
    for d in dtypes:
        out = coarser(out, float_dtype(d))
    return out


def _aval_dtype(v):
    return getattr(getattr(v, "aval", None), "dtype", None)


def _inside(body) -> object:
    """The least precise float dtype of any value in a body (and its nested bodies)."""
    found = coarsest(_aval_dtype(v) for v in body.jaxpr.invars + body.jaxpr.constvars)
    for _, e in walk(body.jaxpr):
        found = coarser(found, coarsest(_aval_dtype(v) for v in e.invars + e.outvars))
    return found


def _through(jaxpr, start: list) -> list:
    """Forward over ``jaxpr``: each output's least precise upstream dtype, ``start`` giving the
    invars' (what the values passed in went through already)."""
    seen = {v: coarser(d, float_dtype(_aval_dtype(v))) for v, d in zip(jaxpr.invars, start)}
    seen.update((v, float_dtype(_aval_dtype(v))) for v in jaxpr.constvars)

    def read(v):
        return float_dtype(_aval_dtype(v)) if type(v) is Literal else seen.get(v)
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        inner = bodies(eqn)
        if len(inner) == 1 and eqn.primitive.name in TRANSPARENT_CALLS \
                and len(inner[0].jaxpr.invars) == len(ins):
            outs = _through(inner[0].jaxpr, ins)
            b = inner[0].jaxpr
            outs = [coarser(o, coarsest(_aval_dtype(c) for c in b.constvars)) for o in outs]
        else:
            upstream = coarsest(ins) if ins else None
            for body in inner:
                upstream = coarser(upstream, _inside(body))
            outs = [upstream] * len(eqn.outvars)
        for v, d in zip(eqn.outvars, outs):
            seen[v] = coarser(d, float_dtype(_aval_dtype(v)))
    return [read(v) for v in jaxpr.outvars]


def least_precise_dtype(closed, outputs=None) -> list:
    """For each output of ``closed`` (a ClosedJaxpr or Jaxpr; ``outputs``: indices, default
    all), the least precise float dtype among the values it is computed from, itself included
    (None: no float on its way). See the module doc."""
    jaxpr = getattr(closed, "jaxpr", closed)
    got = _through(jaxpr, [None] * len(jaxpr.invars))
    return got if outputs is None else [got[k] for k in outputs]


def narrow(dtype) -> str | None:
    """The name of ``dtype`` when it is less precise than float32 (bfloat16, float16, the
    float8s), else None: a value whose computation passes through one rounds as it does."""
    return str(float_dtype(dtype)) if eps(dtype) > eps(np.float32) else None


def gradient_dtypes(loss, trainable, batch, *, closed=None) -> tuple:
    """``([loss], [each gradient leaf])`` of ``jax.value_and_grad(loss)(trainable, batch)``: the
    name of the least precise dtype less precise than float32 each one's computation passes
    through (:func:`narrow`), else None. The loss's own dataflow first (``closed``: the loss
    traced already): a loss that never leaves float32, with no narrower parameters, needs no
    trace of its gradient."""
    n = len(jax.tree.leaves(trainable))
    closed = closed if closed is not None else jax.make_jaxpr(loss)(trainable, batch)
    if narrow(coarsest([least_precise_dtype(closed)[0]] + [
            x.dtype for x in jax.tree.leaves(trainable)])) is None:
        return (None,), (None,) * n
    got = least_precise_dtype(jax.make_jaxpr(jax.value_and_grad(loss))(trainable, batch))
    return (narrow(got[0]),), tuple(narrow(d) for d in got[1:])


def narrower_than_own(closed) -> list:
    """Per output: the dtype its rounding comes from when that is less precise than the output's
    own dtype (a float32 gradient of a bfloat16 matmul), else None."""
    jaxpr = getattr(closed, "jaxpr", closed)
    out = []
    for v, d in zip(jaxpr.outvars, least_precise_dtype(closed)):
        own = float_dtype(_aval_dtype(v))
        out.append(d if own is not None and d is not None and eps(d) > eps(own) else None)
    return out


def ulp(dtype, x: float) -> float:
    """The spacing of ``dtype``'s numbers at magnitude ``x`` (one unit in the last place: a
    bfloat16 value in [0.125, 0.25) is a multiple of 2⁻¹⁰); 0 for ``x`` = 0 or a non-float."""
    d = float_dtype(dtype)
    x = abs(float(x))
    if d is None or x == 0 or not np.isfinite(x):
        return 0.0
    fi = jnp.finfo(d)
    exponent = max(int(np.floor(np.log2(x))), int(fi.minexp))
    return float(2.0 ** (exponent - int(fi.nmant)))


def widened(loss, trainable, batch):
    """``loss`` as a float64 twin: ``f(t, b)`` (float64 arguments shaped like ``trainable`` and
    like ``batch`` or a slice of its rows) traces ``loss`` at the arguments' own dtypes and
    evaluates the jaxpr with every float widened to float64 (``ir.widen``: a cast to bfloat16
    becomes a cast to float64), so a model that computes in bfloat16 whatever its parameters'
    dtype gets its exact arithmetic. Differentiable; call under ``jax.enable_x64(True)``."""
    from mlsys_jax.ir.evaluate import eval_open

    dtypes = [x.dtype for x in jax.tree.leaves((trainable, batch))]

    def f(t, b):
        leaves, tree = jax.tree.flatten((t, b))
        specs = tree.unflatten([jax.ShapeDtypeStruct(x.shape, d) for x, d in zip(leaves, dtypes)])
        closed = jax.make_jaxpr(loss)(*specs)
        return eval_open(closed.jaxpr, closed.consts, leaves, widen=True)[0]
    return f


def split_sums(closed, parts: int):
    """``f(*args)``: ``closed`` evaluated with every contraction (``dot_general``) whose result
    is narrower than float32 computed as ``parts`` partial contractions over its longest
    contracting dimension, each of that dtype, added in that dtype (as XLA adds them: under
    ``jit`` it may keep the running sum wider, as on the mesh): what a mesh
    that splits the contracted features over ``parts`` devices (tensor parallelism's
    row-parallel matmuls) computes. An equivalent computation of the same mathematics, so its
    difference from ``closed`` is rounding of that dtype. Calls with one body are followed;
    other bodies run as they are. Traceable and differentiable."""
    from mlsys_jax.compat import bind_equation
    from mlsys_jax.ir.interpret import eval_jaxpr

    def handler(eqn, vals):
        inner = bodies(eqn)
        if len(inner) == 1 and eqn.primitive.name in TRANSPARENT_CALLS:
            return eval_jaxpr(inner[0].jaxpr, inner[0].consts, *vals, handler=handler)
        if eqn.primitive.name != "dot_general" or not narrow(_aval_dtype(eqn.outvars[0])):
            return None
        (lc, rc), _ = eqn.params["dimension_numbers"]
        sizes = [(vals[0].shape[a], a, b) for a, b in zip(lc, rc)
                 if vals[0].shape[a] % parts == 0 and vals[0].shape[a] >= 2 * parts]
        if not sizes:
            return None
        size, a, b = max(sizes)
        step, total = size // parts, None
        for k in range(parts):
            lhs = jax.lax.slice_in_dim(vals[0], k * step, (k + 1) * step, axis=a)
            rhs = jax.lax.slice_in_dim(vals[1], k * step, (k + 1) * step, axis=b)
            part = bind_equation(eqn, [lhs, rhs])[0]
            total = part if total is None else total + part
        return [total]

    def f(*args):
        return eval_jaxpr(closed.jaxpr, closed.consts, *args, handler=handler)
    return f
