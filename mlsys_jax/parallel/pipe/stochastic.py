"""Programs that draw random numbers (dropout): the same bits on one device as on the mesh.

A pipeline stage computes each microbatch on its own rows of the batch; so does the one-device
reference B (``verdict.references``), from the same traced jaxpr and the same rows, keys
included. Its random draws are therefore the pipeline's exactly: with one key per example in the
batch (``jax.random.split(key, B)``, a ``(B, 2)`` uint32 array or typed keys), split with the
data like any other leaf. The whole batch A draws the same bits only when the loss draws per
example; a loss that draws one mask for the whole batch (one key of the batch, or a key fixed
inside it) gives every microbatch other masks than its rows get in the whole batch, and no
one-device computation of the whole batch draws what the pipeline draws.

Two things follow (``verdict.judge_step(stochastic=True)``):

- the float64 twin must draw the float32 program's bits: the user's code traced again in float64
  draws 64-bit uniforms, other masks altogether, and the spread between two draws is no
  rounding noise (it made a 0.82 bound on a loss of 1). :func:`same_bits_widened` evaluates the
  float32 jaxpr in float64 except where a value derives from a PRNG key and no float input: the
  random numbers are the program's own, widened exactly, and the arithmetic on them float64's;
- the noise never includes A (whose draws may differ) and the reference is B; separability
  (A = B in the twin, within what float32 can tell) then says whether one device's whole batch
  draws those bits too.

A single key in the batch (``{"x": .., "y": .., "rng": jax.random.key(0)}``, no batch axis:
:func:`shared_leaves`) is read whole by every microbatch, on every device: such a loss draws
for the whole batch at once.

When it does not, the pipeline can only be compared with randomness off: a ``loss_fn`` with a
``deterministic`` keyword (flax's convention) is planned and checked again with
``deterministic=True`` (:func:`dropout_off`); otherwise exactness is not claimed.
"""
from __future__ import annotations

import inspect
from functools import partial

import jax

from mlsys_jax.compat import Literal, bind_equation
from mlsys_jax.ir import primitive_counts
from mlsys_jax.ir.evaluate import eval_equation
from mlsys_jax.ir.primitives import RNG_BITS, TRANSPARENT_CALLS
from mlsys_jax.ir.walk import bodies
from mlsys_jax.ir.widen import bind_widened_blocks, is_float, literal_value, widen_value

OFF_FLAG = "deterministic"


def shared_leaves(batch) -> tuple:
    """Per batch leaf, whether it is one PRNG key for the whole batch rather than a leaf with a
    batch axis: a typed key of shape () (``jax.random.key(0)``), or a ``uint32[2]``
    (``jax.random.PRNGKey(0)``) beside leaves whose batch is not 2 rows. Every microbatch reads
    it whole, on every device, as every microbatch of one device would."""
    leaves = jax.tree.leaves(batch)
    typed = [_is_key(x) and getattr(x, "ndim", 0) == 0 for x in leaves]
    raw = [not t and getattr(x, "dtype", None) == jax.numpy.uint32 and tuple(x.shape) == (2,)
           for t, x in zip(typed, leaves)]
    rows = {x.shape[0] for x, t, r in zip(leaves, typed, raw) if not (t or r) and x.ndim}
    return tuple(t or (r and rows and 2 not in rows) for t, r in zip(typed, raw))


def draws_random(closed) -> bool:
    """Whether the loss's jaxpr draws random bits anywhere (nested bodies included)."""
    prims = primitive_counts(closed)
    return any(p in prims for p in RNG_BITS)


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.extended)


def _widened(x, aval) -> bool:
    """A float the twin holds wider than the program does (it derives from a float input)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and is_float(dtype) and dtype != aval.dtype


def _eval(jaxpr, consts, args, keyed: set) -> tuple[list, set]:
    """``jaxpr`` in float64, except equations that read a PRNG key or a value derived from one
    and no widened float (``keyed``: the indices of ``args`` so derived): those run at the
    program's own dtypes, their outputs widened only where widened values read them. Returns
    the outputs as the program holds them and the indices of those derived from keys."""
    env, rnd = dict(zip(jaxpr.constvars, consts)), set()
    env.update(zip(jaxpr.invars, args))
    rnd.update(v for i, v in enumerate(jaxpr.invars) if i in keyed or _is_key(args[i]))

    def read(v, wide):
        if type(v) is Literal:
            return literal_value(v, wide)
        return widen_value(env[v]) if wide else env[v]
    for eqn in jaxpr.eqns:
        own = [read(v, False) for v in eqn.invars]
        wide = any(_widened(x, v.aval) for x, v in zip(own, eqn.invars))
        drawn = [i for i, v in enumerate(eqn.invars) if type(v) is not Literal and v in rnd]
        inner = bodies(eqn) if eqn.primitive.name in TRANSPARENT_CALLS else []
        if drawn and not wide:          # the program's own random numbers, bit for bit
            outs = bind_equation(eqn, own)
            rnd.update(eqn.outvars)
        elif len(inner) == 1 or eqn.primitive.name == "scan":
            outs, keyed_outs = (_eval(inner[0].jaxpr, inner[0].consts, own, set(drawn))
                                if inner else _scan(eqn.params, own, set(drawn)))
            rnd.update(eqn.outvars[i] for i in keyed_outs)
        else:
            outs = bind_widened_blocks(eqn, own)
            if outs is None:
                outs = eval_equation(eqn, [read(v, True) for v in eqn.invars], True)
        env.update(zip(eqn.outvars, outs))
    return ([read(v, False) for v in jaxpr.outvars],
            {i for i, v in enumerate(jaxpr.outvars) if type(v) is not Literal and v in rnd})


def _scan(p: dict, vals: list, keyed: set) -> tuple[list, set]:
    """A ``scan`` by :func:`_eval`, one iteration at a time (a layer stack's dropout draws in
    its body: ``nn.scan``); the carry's derivation from keys follows the iterations."""
    nc, nk, body = p["num_consts"], p["num_carry"], p["jaxpr"]
    consts, carry, xs = vals[:nc], vals[nc:nc + nk], vals[nc + nk:]
    fixed = {i for i in keyed if i < nc or i >= nc + nk}
    carried, ys, out_keyed = {i for i in keyed if nc <= i < nc + nk}, [], set()
    steps = range(p["length"] - 1, -1, -1) if p["reverse"] else range(p["length"])
    for i in steps:
        out, out_keyed = _eval(body.jaxpr, body.consts, consts + carry + [x[i] for x in xs],
                               fixed | carried)
        carry, carried = out[:nk], {nc + j for j in out_keyed if j < nk}
        ys.append(out[nk:])
    if p["reverse"]:
        ys.reverse()
    stacked = [jax.numpy.stack([y[j] for y in ys]) for j in range(len(body.jaxpr.outvars) - nk)]
    return list(carry) + stacked, out_keyed


def same_bits_widened(loss, trainable, batch, *, x64: bool = False):
    """``loss`` as a float64 twin that draws the float32 program's random bits: ``f(t, b)``
    (float64 arguments shaped like ``trainable`` and like ``batch`` or a slice of its rows)
    traces ``loss`` at the arguments' own dtypes and JAX's float setting when the program was
    traced (``x64``: under it ``jax.random.bernoulli(key, 0.5)`` draws float64 uniforms, other
    bits than the float32 defaults draw), and evaluates its jaxpr with every float
    widened to float64, except the values derived from PRNG keys alone (random bits, the
    uniforms and masks made of them), computed as the program computes them and then widened
    exactly. Differentiable; call under ``jax.enable_x64(True)``."""
    dtypes = [x.dtype for x in jax.tree.leaves((trainable, batch))]

    def f(t, b):
        leaves, tree = jax.tree.flatten((t, b))
        specs = tree.unflatten([jax.ShapeDtypeStruct(x.shape, d) for x, d in zip(leaves, dtypes)])
        with jax.enable_x64(x64):   # as the program draws (float32 uniforms, by default)
            closed = jax.make_jaxpr(loss)(*specs)
        return widen_value(_eval(closed.jaxpr, closed.consts, leaves, set())[0][0])
    return f


def off_switch(loss_fn):
    """``loss_fn`` with randomness off (``deterministic=True``), or None when it has no such
    keyword (a function whose signature cannot be read has none)."""
    try:
        names = inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return None
    return partial(loss_fn, **{OFF_FLAG: True}) if OFF_FLAG in names else None
