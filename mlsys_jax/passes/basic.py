"""Structural passes: dce, cse, fold_constants, inline (TensorFlow's graph-level clean-ups, §8.1).

Each is a factory returning a named :class:`Pass`; options exist so a fuzzer can build deliberately
broken variants (docs/verification.md §4) — e.g. ``cse(param_blind=True)`` or ``fold_constants(keep_weak=False)``.
They edit equation lists (``passes.engine.edit``, ``ir.edit``): JAX's own equations are kept or
dropped and their inputs renamed, so no equation is traced again.
"""
from __future__ import annotations

import math

import jax
import numpy as np

from mlsys_jax.compat import ClosedJaxpr, DropVar, Literal, eval_context
from mlsys_jax.ir import input_structs, interpret
from mlsys_jax.ir.consts import fold_equation
from mlsys_jax.ir.edit import dce_jaxpr, known
from mlsys_jax.ir.interpret import LIFT_BYTES
from mlsys_jax.ir.keys import params_key, value_key
from mlsys_jax.ir.primitives import PLAIN_CALLS
from mlsys_jax.ir.walk import bodies, body_path
from mlsys_jax.passes.core import Log, Pass, PassResult, edit_pass, is_pure
from mlsys_jax.passes.engine import edit
from mlsys_jax.passes.rewrite.linear import is_conv_bias_call

FOLD_MAX_ELEMENTS = 1024  # a folded value may exceed its largest input only up to this size


# ---- dce ------------------------------------------------------------------------------------

def _size(eqn) -> int:
    """An equation and every equation nested in its bodies."""
    return 1 + sum(_size(e) for b in bodies(eqn) for e in b.jaxpr.eqns)


def removed_equations(old, new) -> int:
    """How many equations (nested ones too) ``old`` has more than ``new``, where ``new`` keeps
    ``old``'s unchanged equations as the same objects (JAX's DCE does): only the equations that
    differ are counted into."""
    kept = {id(e) for e in new.eqns}
    gone = [e for e in old.eqns if id(e) not in kept]
    if not gone:
        return 0
    was = {id(e) for e in old.eqns}
    return sum(map(_size, gone)) - sum(_size(e) for e in new.eqns if id(e) not in was)


def dce() -> Pass:
    """Dead-code elimination: keep only what the outputs need, and every effectful equation."""
    def fn(closed):
        new = dce_jaxpr(closed)
        removed = removed_equations(closed.jaxpr, new.jaxpr)
        if removed == 0 and len(new.consts) == len(closed.consts):
            return PassResult(closed, False)
        log = Log("dce")
        log.fired("", f"removed {removed} dead equation(s)")
        return PassResult(new, True, tuple(log.rewrites))
    return Pass("dce", fn)


def prune_outputs(closed: ClosedJaxpr, keep) -> ClosedJaxpr:
    """Partial execution (§8.1): a jaxpr computing only outputs ``keep`` (indices), and only what
    they need; effects are kept."""
    keep = list(keep)
    sub = jax.make_jaxpr(lambda *a: [interpret(closed, *a)[i] for i in keep])(
        *input_structs(closed))
    return dce_jaxpr(sub)


# ---- cse ------------------------------------------------------------------------------------

def cse(param_blind: bool = False) -> Pass:
    """Common-subexpression elimination: merge pure equations with the same primitive, params and
    inputs (literals keyed by value, dtype and weak_type; params by ``ir.keys`` at full strictness:
    bodies by structure, rules and other functions by identity). Effectful, opaque (unknown) and
    remat-protected (``prevent_cse``) equations are never merged."""
    def make_visit(ed, log, path):
        table: dict = {}   # key -> (outputs of the first such equation, its index)
        env = ed.env

        def visit(i, eqn):
            if not is_pure(eqn) or eqn.params.get("prevent_cse"):
                return False
            params = "" if param_blind else params_key(eqn.params, strict=True)
            key = (eqn.primitive.name, params,
                   *[value_key(v.val, v.aval) if type(v) is Literal else id(env.get(v, v))
                     for v in eqn.invars])
            hit = table.get(key)
            if hit is not None:
                ed.bind(eqn.outvars, hit[0])
                log.fired(f"{path}{i}", f"{eqn.primitive.name} = equation {path}{hit[1]}")
                return True
            if not any(type(v) is DropVar for v in eqn.outvars):  # a dropped output has no name
                table[key] = (eqn.outvars, i)
            return False  # kept, and CSE runs inside its bodies too
        return visit
    return edit_pass("cse", make_visit)


# ---- fold_constants --------------------------------------------------------------------------

def _elements(aval) -> int:
    return int(math.prod(getattr(aval, "shape", ()) or ()))


def _resident(value, var):
    """A large folded NumPy value as a device array (the one copy kept): the programs that run
    the folded graph (the value check, timing) take it as an argument, and JAX copies a NumPy
    argument to the device on every call. Only where the array is exactly what ``var`` types
    (shape, canonical dtype, not weak), so the folded graph's types do not change."""
    if (not isinstance(value, np.ndarray) or value.nbytes < LIFT_BYTES
            or var.aval.weak_type or value.shape != var.aval.shape
            or value.dtype != var.aval.dtype
            or jax.dtypes.canonicalize_dtype(value.dtype) != value.dtype):
        return value
    return jax.device_put(value)


def fold_constants(max_elements: int = FOLD_MAX_ELEMENTS, keep_weak: bool = True) -> Pass:
    """Evaluate pure equations whose inputs are all constants, as XLA:CPU's kernels compute them
    (``ir.consts.fold_equation``: subnormals read as zero, results flushed). An equation whose
    result depends on where it is computed — XLA's compile-time folder does not flush — is left
    to the compiler, with the reason logged. Zero-input producers (iota, a broadcast literal) are
    never expanded into a constant bigger than ``max_elements`` or than their largest input. A
    folded value becomes a constvar of the new jaxpr, as a constant does when JAX traces."""
    def make_visit(ed, log, path):
        def visit(i, eqn):
            if not eqn.invars or not is_pure(eqn):
                return False
            vals = []
            for v in eqn.invars:
                x = ed.value(v)
                if x is None:
                    return False
                vals.append(x)
            largest = max((_elements(v.aval) for v in eqn.outvars), default=0)
            if largest > max_elements and largest > max(_elements(v.aval) for v in eqn.invars):
                return False
            outs, why = fold_equation(eqn, vals)  # eagerly, as XLA:CPU's kernels compute it
            if outs is None:
                log.refused(f"{path}{i}", why, check="computed_as_xla_computes")
                return False
            if not keep_weak:  # a deliberately broken variant for mutation testing
                outs = [jax.numpy.array(o, dtype=o.dtype) for o in outs]
            # computed before the next fold is dispatched: XLA:CPU frees a buffer that a
            # computation still in flight reads only at a later dispatch, so an asynchronous
            # chain of large folds (sin, then mul) would hold each dropped intermediate into
            # the value check's runs
            outs = jax.block_until_ready([_resident(o, v) for o, v in zip(outs, eqn.outvars)])
            ed.bind(eqn.outvars, [known(o, v) for o, v in zip(outs, eqn.outvars)])
            log.fired(f"{path}{i}", eqn.primitive.name)
            return True
        return visit
    p = edit_pass("fold_constants", make_visit, cleanup=dce_jaxpr)

    def fn(closed):
        with eval_context():  # the evaluator's kernels, shared (compile-time eval would not be)
            return p.fn(closed)
    return Pass(p.name, fn)


# ---- inline ----------------------------------------------------------------------------------

def inline(names=None) -> Pass:
    """Inline named calls (``jit[name=...]``) into their parent, recursively, so rules that match
    primitives can see them. custom_jvp/vjp calls stay calls: inlining would drop their derivative
    rules and change gradients (e.g. relu's at 0). Unless named, a ``conv_bias`` call (a conv and
    its bias, the op ``fold_conv_bn`` emits) stays a call too: every conv rule reads through it
    (``rewrite/linear.py``), and opening it would only undo the fold — ``fixpoint(chain(inline(),
    fold_conv_bn()))`` would go round for ever."""
    wanted = None if names is None else frozenset([names] if isinstance(names, str) else names)

    def make_visit(ed, log, path):
        def visit(i, eqn):
            if eqn.primitive.name not in PLAIN_CALLS:
                return False
            name = eqn.params.get("name")
            if wanted is not None and name not in wanted:
                return False
            if wanted is None and is_conv_bias_call(eqn):
                return False
            body = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr")
            if not isinstance(body, ClosedJaxpr) or body.effects:
                return False  # keep effectful calls as calls: order and effects stay explicit
            here = f"{path}{i}"
            log.fired(here, f"inlined {name}")
            inner = edit(body, make_visit, log, body_path(here, bodies(eqn)[0]))  # calls inside
            ed.bind(eqn.outvars, ed.inline(inner.jaxpr, inner.consts,
                                           [ed.read(v) for v in eqn.invars]))
            return True
        return visit
    return edit_pass("inline", make_visit)
