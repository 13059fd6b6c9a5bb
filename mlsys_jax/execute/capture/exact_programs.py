"""Compiling recorded segments so that replay rounds exactly as eager JAX does (lecture §8.4).

Eager JAX compiles every dispatch — a primitive, or a whole ``jit`` call — as its own XLA program
and hands it its inputs as arguments. A segment compiles many dispatches as *one* program, where
XLA and LLVM may rewrite across them and change results. Each way was measured on XLA:CPU
(docs/capture.md gives the figures):

- *Fused loops.* LLVM contracts a multiply feeding an add into one FMA (``x * 3 + 1``: one
  rounding instead of eager's two) and turns
  ``where(y > x, y, x)`` into a ``max`` instruction, which reads a subnormal ``y`` as zero
  (XLA:CPU runs with denormals-are-zero; eager's separate compare and select keep ``1e-45``).
  Blocking those patterns is not enough: a transcendental op fused into a longer loop is
  vectorized differently, and its tail elements take another code path (``log`` of a 3-element
  array, last bit). Optimization barriers do not stop fusion. Exact programs are compiled with
  XLA's ``fusion`` pass off: every op is its own kernel, the kernel eager runs for it.
- *The algebraic simplifier and transpose folding* rewrite across dispatches: ``log(exp(x))``
  becomes ``x``; ``x @ x.T`` folds the transpose into the dot and accumulates in another order.
  Every dispatch's outputs pass through ``lax.optimization_barrier``, which these passes do not
  cross; inside a dispatch they still run, as they do for eager.
- *Constants baked into the program* are simplified with it: ``x + 0.0`` becomes ``x`` (at
  ``x = -0.0``, ``1 / (x + 0.0)`` is ``-inf`` instead of eager's ``+inf``; disabling the simplifier
  does not help) and ``x ** 3.0`` becomes ``x * x * x``. Eager passes such constants as arguments,
  and so does a segment: every recorded constant is a parameter of the compiled program.
- A dispatch that eager fuses inside itself in a way that can round differently (``dispatch_units.py``:
  ``jnp.var``, ``lax.erfc``, a user's jitted multiply-add) runs as its own program (a *unit*),
  the same executable eager runs.

Without fusion, XLA:CPU's thunk scheduler takes time superlinear in a program's kernels
(``ExecutionGraph``'s transitive reduction), so a long segment is split into programs of at most ``MAX_PROGRAM_OPS`` primitives.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import jax
import numpy as np

from mlsys_jax.compat import eval_trace, set_current_trace, weak_as
from mlsys_jax.execute.capture.recording import Eqn

EXACT_OPTIONS = {"xla_disable_hlo_passes": "fusion"}
MAX_PROGRAM_OPS = 500


def options(exact: bool):
    """XLA compile options of a program: fusion off in exact mode, ``jax.jit``'s otherwise."""
    return EXACT_OPTIONS if exact else None


def _barrier(outs):
    # Extended dtypes (PRNG keys) carry no rounding: no barrier needed (or supported).
    plain = [i for i, o in enumerate(outs)
             if not jax.dtypes.issubdtype(o.dtype, jax.dtypes.extended)]
    outs = list(outs)
    if plain:
        held = jax.lax.optimization_barrier([outs[i] for i in plain])
        for i, o in zip(plain, held):
            outs[i] = o
    return outs


def bind_eqns(eqns, env: dict, consts, exact: bool = False) -> None:
    """Bind recorded equations into ``env`` (slot -> value); in exact programs, each dispatch's
    outputs pass through a barrier that no simplifier rewrite crosses."""
    for e in eqns:
        args = [env[r] if r >= 0 else consts[-1 - r] for r in e.ins]
        outs = e.prim.bind(*args, **e.params)
        outs = list(outs) if e.prim.multiple_results else [outs]
        env.update(zip(e.outs, _barrier(outs) if exact else outs))


MAX_BAKED_ELEMENTS = 64  # constants up to this size may be baked into a one-program replay


def bakeable(c) -> bool:
    """Whether a recorded constant can be baked into a program (``baked``) instead of passed."""
    return (isinstance(c, jax.Array) and c.size <= MAX_BAKED_ELEMENTS
            and not jax.dtypes.issubdtype(c.dtype, jax.dtypes.extended))


def baked(c):
    """``c`` as a constant of the program being traced, behind an optimization barrier: the
    simplifier and constant folding see an opaque value, as they see an argument (``x + 0.0``
    stays an add), and the call passes no argument for it."""
    out = jax.lax.optimization_barrier(np.asarray(c))
    return weak_as(out, c.weak_type)


def as_param(c):
    """A recorded constant as a device array of the same type (weak types kept)."""
    if isinstance(c, jax.Array):
        return c
    out = jax.device_put(c)
    assert jax.typeof(out) == jax.typeof(c), (jax.typeof(out), jax.typeof(c))
    return out


@dataclass(frozen=True)
class Piece:
    """One compiled program (or one eager unit) of a segment: ``fn(*ins, *consts) -> outs``."""

    fn: Callable
    in_slots: tuple
    out_slots: tuple
    consts: tuple
    unit: str | None = None  # the unit's name when it runs as its own program


def _params_key(params):
    try:
        key = tuple(sorted(params.items()))
        hash(key)
        return key
    except TypeError:
        return None


def _localize(eqns, in_slots, out_slots):
    """Renumber slots and constants locally (a loop's iterations share one program)."""
    local = {s: i for i, s in enumerate(in_slots)}
    const_ids: dict[int, int] = {}
    new = []
    for e in eqns:
        ins = []
        for r in e.ins:
            if r >= 0:
                ins.append(local[r])
            else:
                ins.append(-1 - const_ids.setdefault(r, len(const_ids)))
        for s in e.outs:
            local[s] = len(local)
        new.append(Eqn(e.prim, e.params, tuple(ins), tuple(local[s] for s in e.outs),
                       e.traits))
    return tuple(new), tuple(range(len(in_slots))), tuple(local[s] for s in out_slots), \
        tuple(-1 - r for r in const_ids)


def _program(eqns, n_in, out_local, exact):
    """``(*ins, *consts) -> outs``."""
    def program(*args):
        env = dict(enumerate(args[:n_in]))
        bind_eqns(eqns, env, args[n_in:], exact)
        return [env[s] for s in out_local]
    return program


def _unit_fn(e: Eqn, n_in: int):
    """The same dispatch eager makes (``e`` localized: inputs 0..n_in-1, then constants)."""
    def unit(*args):
        vals = [args[r] if r >= 0 else args[n_in - 1 - r] for r in e.ins]
        with set_current_trace(eval_trace):
            out = e.prim.bind(*vals, **e.params)
        return list(out) if e.prim.multiple_results else [out]
    return unit


def unit_name(e: Eqn) -> str:
    """How a dispatch unit is named in logs: the primitive, with its call's name when it has one."""
    name = e.params.get("name")
    return f"{e.prim.name}[{name}]" if isinstance(name, str) else e.prim.name


def _split(eqns, exact):
    """Runs of equations compiled together: units alone (exact), runs of <= MAX_PROGRAM_OPS."""
    runs, run, size = [], [], 0
    for e in eqns:
        if exact and (e.traits.unit or size + e.traits.size > MAX_PROGRAM_OPS) and run:
            runs.append(run)
            run, size = [], 0
        run.append(e)
        size += e.traits.size
        if exact and e.traits.unit:
            runs.append(run)
            run, size = [], 0
    if run:
        runs.append(run)
    return runs


def compile_pieces(eqns, consts, in_slots, out_slots, exact, cache: dict) -> list[Piece]:
    """The programs that run one segment, in order (one, unless units or a long segment)."""
    runs = _split(eqns, exact)
    needed_later = [set(out_slots)]
    for run in reversed(runs[1:]):
        made = {s for e in run for s in e.outs}
        reads = {r for e in run for r in e.ins if r >= 0}
        needed_later.insert(0, (needed_later[0] - made) | reads)
    pieces = []
    for run, later in zip(runs, needed_later):
        made = {s for e in run for s in e.outs}
        p_in = tuple(dict.fromkeys(r for e in run for r in e.ins if r >= 0 and r not in made))
        p_out = tuple(sorted(made & later))
        leqns, _, lout, cref = _localize(run, p_in, p_out)
        p_consts = tuple(consts[i] for i in cref)
        if exact and len(run) == 1 and run[0].traits.unit:
            pieces.append(Piece(_unit_fn(leqns[0], len(p_in)), p_in, p_out, p_consts, unit_name(run[0])))
            continue
        sig = [(e.prim, _params_key(e.params), e.ins, e.outs) for e in leqns]
        key = None if any(s[1] is None for s in sig) else (exact, tuple(sig), len(p_in), lout)
        fn = cache.get(key) if key is not None else None
        if fn is None:
            fn = jax.jit(_program(leqns, len(p_in), lout, exact), compiler_options=options(exact))
            if key is not None:
                cache[key] = fn
        pieces.append(Piece(fn, p_in, p_out, p_consts))
    return pieces


def run_pieces(pieces, in_slots, out_slots):
    """A function ``(*ins) -> outs`` that runs a segment's pieces (one call when there is one)."""
    if len(pieces) == 1 and pieces[0].in_slots == tuple(in_slots) \
            and pieces[0].out_slots == tuple(out_slots):
        p = pieces[0]
        fn, consts = p.fn, p.consts
        return lambda *ins: fn(*ins, *consts)

    def run(*ins):
        env = dict(zip(in_slots, ins))
        for p in pieces:
            env.update(zip(p.out_slots, p.fn(*[env[s] for s in p.in_slots], *p.consts)))
        return [env[s] for s in out_slots]
    return run


def const_key(c):
    """A constant by value (cold path only): a fresh ``jnp.ones`` each call is the same constant."""
    if isinstance(c, (bool, int, float, complex)):
        return (type(c).__name__, np.asarray(c).tobytes())
    if jax.dtypes.issubdtype(getattr(c, "dtype", np.float32), jax.dtypes.extended):
        return (str(c.dtype), c.shape, np.asarray(jax.random.key_data(c)).tobytes())
    arr = np.asarray(c)
    digest = hashlib.sha1(arr.tobytes()).hexdigest()
    return (arr.dtype.str, arr.shape, bool(getattr(c, "weak_type", False)), digest)
