"""Translation validation compiled: a region and its replacement traced once, run on every draw in
one call, one executable for every region of the same structure.

Validating a rewrite eagerly (``passes/validate.py``) runs the region and its replacement op by op,
in the program's dtypes and in float64, once per draw: twelve evaluations of a conv and its
BatchNorm per fold, each op dispatched alone and each elementwise op computed by NumPy on the
whole activation. Here both sides are traced (``jax.make_jaxpr``) with the same code that
evaluates them eagerly (``validate._run`` for the region, the rule's own emit for the
replacement; ``feature_cut``'s tracing mode binds what they bind on tracers), in both precisions,
into one pair program; XLA compiles it once, fused, and runs it on the ``DRAWS`` inputs stacked
(``jax.vmap``). The values validation reads as constants — the region's constants and what is
computed from them (``validate._given``), and what the rule computes from them (its folded
weights, captured by the trace) — enter the program as arguments, not as compiled-in copies. So
regions that are the same after renaming and differ only in those constants (the 16 bottleneck
Conv+BN folds of a ResNet at each stage's shapes) share one executable (:func:`executable`: keyed
by the pair's structure, ``ir.keys.jaxpr_key`` with constants by name).

What it may change is the rounding of the program-dtype side (XLA's fused kernels, the conv run
on a batch of draws), which validation reads only for finiteness, a millionth share of the
original's own rounding error and, in bfloat16/float16, its error against float64 within a
factor of two; integer results are exact either way, and float64 agrees to ~1e-16 of the 1e-9
test. A pass here is kept; anything else — a failure, a region that cannot be traced or batched
so (:class:`NotCompiled`) — is judged again eagerly (``validate._validate``), so a refusal's
verdict and its measured reason are the eager ones.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import jax
import numpy as np

from mlsys_jax.compat import Literal
from mlsys_jax.ir.keys import jaxpr_key
from mlsys_jax.ir import rebatch
from mlsys_jax.ir.rebatch import Unshrinkable
from mlsys_jax.ir.widen import widen_value
from mlsys_jax.passes import feature_cut

MAX_EXECUTABLES = 256  # pair programs kept (least recently used dropped)
_EXECUTABLES: OrderedDict = OrderedDict()
# A region shape is compiled once it has been validated this many times in the process, and only
# where its values are small. Measured on XLA:CPU (2 cores, shared): a pair program compiles in
# ~0.1-0.2 s (its fused elementwise loops; the convs are library calls); on small regions (the
# tiny ResNet-50, 17 folds) it saves ~2.5 ms of each eager validation (dispatch and Python per
# op), so it pays after ~50-75 validations of one shape (a search's graphs, repeated runs, API
# loops), never on first sight; on a real model's activations (ResNet-50 at 224, GPT-2 small)
# the time is the arithmetic (2 sides x 2 precisions x 3 draws of each conv), which the program
# does no faster (under load slower: its threads contend), so those stay eager
# (``mlsys-jax bench passes``: ``*_compiled_validation_over_unvalidated_ratio``). So do regions
# on a crop of a real model's conv, small values but large weights: their cost is reading the
# weights, which the eager path does faster (a BLAS float64 product of the windows, the float64
# conv shared by both sides of a fold); compiled, ResNet-50's repeated runs slowed from 0.37 s
# to 0.45 s once their last stage's shapes had been seen 64 times.
COMPILE_AFTER = 64
SMALL_ELEMENTS = 1 << 15
_SEEN: dict = {}
STATS = {"compiled": 0, "reused": 0, "eager": 0, "deferred": 0}  # tests, benchmark notes


class NotCompiled(Exception):
    """The region or its replacement cannot be traced, batched or run compiled: judged eagerly."""


def worth_compiling(region, shapes: list, after: int | None = None) -> bool:
    """Whether this region's shape (its equations' primitives and types, the draws' shapes) has
    been validated ``after`` (default :data:`COMPILE_AFTER`) times in this process, counting
    this one, and (by default) its values and constants are small (:data:`SMALL_ELEMENTS`): then
    its pair program is compiled (or already is). ``after`` 1 forces it (tests, the benchmark).
    A cheap key, for the policy only: which executable runs is decided by the pair's whole
    structure (:func:`executable`)."""
    if after is None and _largest(region, shapes) > SMALL_ELEMENTS:
        return False
    key = (tuple((e.primitive.name, tuple(str(v.aval) for v in e.invars if type(v) is not Literal),
                  tuple(str(v.aval) for v in e.outvars)) for e in region.eqns),
           tuple(map(tuple, shapes)))
    seen = _SEEN[key] = _SEEN.get(key, 0) + 1
    if len(_SEEN) > 4 * MAX_EXECUTABLES:
        _SEEN.clear()
    return seen >= (COMPILE_AFTER if after is None else after)


def _largest(region, shapes: list) -> int:
    """Elements of the region's largest value: an input as drawn, an equation's output, or a
    constant it reads (a conv's kernel)."""
    sizes = [math.prod(s) for s in shapes]
    sizes += [math.prod(getattr(v.aval, "shape", ())) for e in region.eqns for v in e.outvars]
    sizes += [math.prod(np.shape(c)) for c in region.consts.values()]
    return max(sizes, default=0)


def draws(region, shapes: list, count: int, draw) -> list:
    """Each input's ``count`` draws stacked along a new leading axis (``draw(shape, dtype, k)``)."""
    return [np.stack([draw(s, v.aval.dtype, k) for k in range(count)])
            for s, v in zip(shapes, region.inputs)]


def run(region, replacement, shapes: list, given: dict, *, narrow: bool, count: int,
        draw, run_eqns) -> list:
    """``[(before, after, before64, after64)]`` per draw, as ``validate`` computes them eagerly
    (``before64``/``after64`` None unless ``narrow``), from one call of the region's compiled pair
    program; :class:`NotCompiled` where it cannot be built or run (``run_eqns``: ``validate._run``;
    ``draw``: ``validate.draw``)."""
    names = list(given)
    try:
        prog = _trace(region, replacement, shapes, given, False, run_eqns)
        wide = _trace(region, replacement, shapes, given, True, run_eqns) if narrow else None
    except Unshrinkable:
        raise  # not on these rows: the caller tries the next shapes, as eagerly
    except Exception as e:  # not traceable so (a NumPy call on a tracer, ...): eagerly
        raise NotCompiled(f"{type(e).__name__}: {e}") from e
    fn = executable(prog, wide)
    xs = draws(region, shapes, count, draw)
    try:
        with jax.enable_x64(True):
            outs = fn(list(prog.consts), [] if wide is None else list(wide.consts),
                      [given[v] for v in names], xs)
            outs = jax.tree_util.tree_map(np.asarray, outs)
    except Exception as e:  # a primitive without a batching rule, ...
        raise NotCompiled(f"{type(e).__name__}: {e}") from e
    n = len(region.outputs)
    got = []
    for k in range(count):
        before, after = ([np.asarray(o[k]) for o in outs[0][j * n:(j + 1) * n]] for j in (0, 1))
        if wide is None:
            got.append((before, after, None, None))
            continue
        b64, a64 = ([np.asarray(o[k]) for o in outs[1][j * n:(j + 1) * n]] for j in (0, 1))
        got.append((before, after, b64, a64))
    return got


def _trace(region, replacement, shapes: list, given: dict, widen: bool, run_eqns):
    """The region and its replacement as one ClosedJaxpr of (the given constants' values, the
    inputs), in the program's dtypes or (``widen``) in float64: the same code that evaluates them
    eagerly, bound on tracers (``feature_cut``'s tracing mode)."""
    names = list(given)

    def pair(given_vals, inputs):
        given = dict(zip(names, given_vals))
        env = {v: (widen_value(x) if widen else x) for v, x in zip(region.inputs, inputs)}
        env.update(given)
        with rebatch.side():
            run_eqns(region.eqns, env, widen, given, None)
        before = [_out(env[v], widen) for v in region.outputs]
        values = {v: (widen_value(x) if widen else x) for v, x in zip(region.inputs, inputs)}
        with rebatch.side():
            outs = replacement(values.__getitem__, widen)
        after = [_out(outs[v], widen) for v in region.outputs]
        return before + after

    given_structs = [_struct(np.shape(given[v]), _dtype(given[v]), False) for v in names]
    input_structs = [_struct(s, v.aval.dtype, getattr(v.aval, "weak_type", False))
                     for s, v in zip(shapes, region.inputs)]
    with feature_cut.tracing():
        if widen:
            with jax.enable_x64(True):
                return jax.make_jaxpr(pair)(given_structs, input_structs)
        return jax.make_jaxpr(pair)(given_structs, input_structs)


def _struct(shape, dtype, weak: bool):
    return jax.ShapeDtypeStruct(tuple(shape), dtype, weak_type=bool(weak))


def _dtype(x):
    return x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype


def _out(x, widen: bool):
    """An output as the eager evaluation hands it to the judge: unwrapped, widened when ``widen``
    (a constant output is still a concrete array: made a traced value of the pair)."""
    x = feature_cut.unwrap(x)
    if widen:
        x = widen_value(x)
    return jax.numpy.asarray(x)


def executable(prog, wide):
    """The compiled pair program for ``prog`` (and ``wide``, its float64 twin), shared by every
    region of the same structure: the key is the pair's jaxprs with constants by name and type
    (their values are arguments)."""
    key = tuple((jaxpr_key(j, strict=True), tuple(str(v.aval) for v in j.constvars))
                for j in (prog.jaxpr, None if wide is None else wide.jaxpr) if j is not None)
    fn = _EXECUTABLES.get(key)
    if fn is not None:
        _EXECUTABLES.move_to_end(key)
        STATS["reused"] += 1
        return fn
    STATS["compiled"] += 1
    fn = _EXECUTABLES[key] = jax.jit(_batched(prog.jaxpr, None if wide is None else wide.jaxpr))
    if len(_EXECUTABLES) > MAX_EXECUTABLES:
        _EXECUTABLES.popitem(last=False)
    return fn


def _batched(prog_jaxpr, wide_jaxpr):
    """``fn(prog_consts, wide_consts, given, xs)``: both pair programs on the draws stacked in
    ``xs`` (leading axis), constants and given values shared by every draw."""
    def one(pc, wc, given, xs):
        prog = _eval(prog_jaxpr, pc, list(given) + list(xs))
        wide = [] if wide_jaxpr is None else _eval(wide_jaxpr, wc, list(given) + list(xs))
        return prog, wide

    def fn(pc, wc, given, xs):
        return jax.vmap(one, in_axes=(None, None, None, 0))(pc, wc, given, xs)
    return fn


def _eval(jaxpr, consts, args) -> list:
    """An open jaxpr on ``args``: literals at their own dtype (the float32 side runs beside the
    float64 one, under ``jax.enable_x64``)."""
    from mlsys_jax.compat import bind_equation

    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))

    def read(v):
        return np.asarray(v.val, v.aval.dtype) if type(v) is Literal else env[v]
    for eqn in jaxpr.eqns:
        env.update(zip(eqn.outvars, bind_equation(eqn, [read(v) for v in eqn.invars])))
    return [read(v) for v in jaxpr.outvars]
