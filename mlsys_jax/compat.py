"""The one module that touches ``jax._src`` or version-specific JAX details (JAX 0.10.x).

Everything else in mlsys_jax imports these names from here, so a JAX upgrade is fixed in one file.
"""
from __future__ import annotations

import contextlib

import jax
import jax.extend.core as jcore
from jax._src import core as _core
from jax._src import xla_bridge as _xla_bridge
from jax._src.interpreters import partial_eval as _pe

ClosedJaxpr = jcore.ClosedJaxpr
Jaxpr = jcore.Jaxpr
JaxprEqn = jcore.JaxprEqn
Var = jcore.Var
Literal = jcore.Literal
DropVar = jcore.DropVar
Primitive = jcore.Primitive
check_jaxpr = jcore.check_jaxpr
jaxpr_as_fun = jcore.jaxpr_as_fun
eval_jaxpr = jax.core.eval_jaxpr

# Custom traces (graph-break capture): JAX's tracing machinery.
Trace = _core.Trace
Tracer = _core.Tracer
set_current_trace = _core.set_current_trace
eval_trace = getattr(_core, "eval_trace", None)
# Evaluate eagerly even under an outer trace, with the same compiled kernels as plain eager code
# (jax.ensure_compile_time_eval is part of the jit cache key: it would compile every op again).
eval_context = _core.eval_context
cached_abstract_eval = _pe._cached_abstract_eval
ShapedArray = _core.ShapedArray


def backend_started() -> bool:
    """True once JAX has initialised a backend (XLA_FLAGS can no longer change device counts)."""
    return bool(getattr(_xla_bridge, "_backends", None))


def bind_equation(eqn, invals):
    """Bind ``eqn``'s primitive to ``invals`` with its params, as JAX itself would re-bind it.

    JAX 0.10: ``get_bind_params`` returns a dict whose ``subfuns`` entry holds the callables of
    call-like primitives (custom_jvp_call, custom_vjp_call); ``bind`` takes them as a keyword, as
    ``jax.core.eval_jaxpr`` does. Returns a list of output values (one per outvar).
    """
    params = eqn.primitive.get_bind_params(eqn.params)
    out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def varying_axes(x) -> frozenset:
    """Mesh axes over which ``x`` varies inside shard_map (JAX 0.10: ``aval.manual_axis_type``;
    older releases called it ``aval.vma``). Empty outside shard_map."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))


# Graph-break capture: the effects a compiled segment replays like jax.jit does
# (jax.debug.print / debug.callback).
from jax._src import debugging as _debugging  # noqa: E402

debug_effects = (_debugging.debug_effect, _debugging.ordered_debug_effect)


def call_name(eqn) -> str | None:
    """The user-visible name of a call-like equation (``jit[name=f]``, ``custom_jvp_call`` of relu).

    jit keeps it in ``params['name']``; custom_jvp/vjp calls only in the body's debug info.
    """
    name = eqn.params.get("name")
    if isinstance(name, str):
        return name
    body = eqn.params.get("call_jaxpr")
    info = getattr(getattr(body, "jaxpr", body), "debug_info", None)
    name = getattr(info, "func_name", None)
    if not name:
        src = getattr(info, "func_src_info", None) or ""
        name = src.split(" ")[0] if src else None
    return name or None


# Passes: JAX's own dead-code elimination, which keeps effectful equations and prunes
# nested bodies (jit, scan, cond, while, remat) through their registered DCE rules.
dce_jaxpr_consts = _pe.dce_jaxpr_consts
jax_dce_jaxpr = _pe.dce_jaxpr  # the yardstick of benchmarks/bench_passes.py (cached by identity)


# Remat planner: the residuals a VJP keeps, each with its source ("named 'v3' from …",
# "from the argument …"); jax.ad_checkpoint only exports the printing form.
from jax._src.ad_checkpoint import saved_residuals  # noqa: E402,F401


# ---- Building jaxprs from equation lists (structural passes) ---------------------------------
# The structural passes (dce, cse, inline, fold_constants) copy JAX's own equations into a new
# jaxpr instead of re-tracing every one: an equation keeps its params, effects and literals as JAX
# bound them; only its input variables change. These are JAX's constructors for that, and its
# type check of one equation (the verifier re-checks only equations it has not seen typed).
from jax._src.core import DebugInfo as _DebugInfo, typecheck as _typecheck  # noqa: E402

typeof = jax.typeof


def new_jaxpr(like, constvars, outvars, eqns):
    """A Jaxpr with ``like``'s inputs and debug info (same arity) and new constvars, outputs and
    equations; its effects are recomputed from the equations, as JAX's tracer does."""
    effects = _pe.make_jaxpr_effects(constvars, like.invars, outvars, eqns)
    return Jaxpr(constvars, like.invars, outvars, eqns, effects, like.debug_info, like.is_high)


def literal_fits(literal) -> bool:
    """A literal's value matches its type annotation (what ``check_jaxpr`` checks of literals)."""
    return _typecheck(literal.aval, literal.val)


def effects_declared(jaxpr) -> bool:
    """Every equation's effect is among the jaxpr's effects (JAX's rule: a named-axis effect may
    be discharged; an input effect must name an input)."""
    try:
        needed = _pe.make_jaxpr_effects(jaxpr.constvars, jaxpr.invars, jaxpr.outvars, jaxpr.eqns)
    except ValueError:
        return False
    return all(e in jaxpr.effects or isinstance(e, _core.NamedAxisEffect) for e in needed)


def check_equation(eqn) -> None:
    """JAX's type check of one equation (and, recursively, its bodies): ``check_jaxpr`` of a jaxpr
    holding only ``eqn``. Raises JAX's JaxprTypeError."""
    free, seen = [], set()
    for v in eqn.invars:
        if isinstance(v, Var) and not isinstance(v, Literal) and id(v) not in seen:
            seen.add(id(v))
            free.append(v)
    outs = [v for v in eqn.outvars if not isinstance(v, DropVar)]
    info = _DebugInfo("check_equation", eqn.primitive.name, ("",) * len(free), ("",) * len(outs))
    check_jaxpr(Jaxpr((), free, outs, [eqn], eqn.effects, info))


# ---- An open trace for numeric rewrites (passes/core.transform) -------------------------------
# A numeric rule computes replacement outputs with ordinary JAX code. Instead of re-tracing the
# whole jaxpr around it (make_jaxpr), a Fragment keeps one of JAX's DynamicJaxprTraces open for a
# jaxpr level: inputs are added when a rule first reads a value, each rule call's equations are
# recorded in order, and to_jaxpr turns them into a jaxpr the caller splices in. JAX 0.10 API:
# DynamicJaxprTrace(debug_info, parent_trace, lower, auto_dce), trace.new_arg, frame.tracing_eqns,
# frame.to_jaxpr (what pe.trace_to_jaxpr does, one call at a time).
from jax._src import source_info_util as _source_info  # noqa: E402


class Fragment:
    """Equations traced a call at a time (see above)."""

    def __init__(self, name: str):
        self.info = _DebugInfo("rewrite", name, None, None)
        self.trace = _pe.DynamicJaxprTrace(self.info, parent_trace=_core.trace_ctx.trace,
                                           auto_dce=False)
        self.source = _source_info.current()

    def arg(self, aval):
        """A new input of the fragment (a tracer)."""
        return self.trace.new_arg(aval, self.source)

    def active(self):
        """Context in which JAX operations are recorded into the fragment."""
        return set_current_trace(self.trace)

    def mark(self) -> int:
        """How many equations are recorded so far."""
        return len(self.trace.frame.tracing_eqns)

    def finish(self, outs) -> tuple:
        """(jaxpr, consts) of everything recorded, with ``outs`` (tracers or values) as outputs;
        its equations are in recording order, so :meth:`mark` positions index them."""
        tracers = [self.trace.to_jaxpr_tracer(x, self.source) for x in outs]
        jaxpr, consts = self.trace.frame.to_jaxpr(self.trace, tracers, self.info, self.source)
        self.close()
        return jaxpr, consts

    def close(self) -> None:
        """Drop what was recorded (the trace and its equations refer to each other)."""
        self.trace.invalidate()


# Graph-break capture's warm calls and one-program replay (execute/capture/): the
# concrete array type (a warm call's fast path keys arguments by their cached ``aval``), and zeros
# of an exact abstract type, weak type included (the "outcome not seen yet" branch must return the
# same types as the others; jnp.zeros is always strongly typed).
from jax._src.array import ArrayImpl  # noqa: E402,F401
from jax._src.lax.lax import _convert_element_type  # noqa: E402


def weak_as(x, weak_type: bool):
    """``x`` (strongly typed) with the weak type ``weak_type``."""
    return _convert_element_type(x, x.dtype, weak_type=True) if weak_type else x


def zeros_of(aval):
    """Traced zeros with ``aval``'s shape, dtype and weak type."""
    return weak_as(jax.lax.full(aval.shape, 0, aval.dtype), aval.weak_type)


# ---- Where an equation came from (ir/provenance.py) -------------------------------------------
# ``eqn.source_info`` holds a NameStack (JAX 0.10: a tuple of Scope(name) and Transform(name)
# elements; ``str()`` folds transforms in as ``jvp(M)/block0``) and the Traceback of the line that
# traced the equation (``raw_frames()``: code objects and instruction offsets, innermost first).
_Scope = _source_info.Scope


def name_scopes(source_info) -> tuple[str, ...]:
    """The scope names of an equation's name stack (``jax.named_scope``, flax and haiku module
    names), without transforms (``jvp``, ``vmap``, ``transpose``)."""
    stack = getattr(getattr(source_info, "name_stack", None), "stack", ())
    return tuple(e.name for e in stack if isinstance(e, _Scope) and e.name)


def name_stack_text(source_info) -> str:
    """The name stack as JAX prints it (``vmap(eqx.nn.Conv)``)."""
    return str(getattr(source_info, "name_stack", ""))


def nested_source_info(outer, inner):
    """``inner`` (an equation's source info inside a body) with ``outer``'s name stack before its
    own, as JAX names an equation when it inlines a body (``jax.core.eval_jaxpr``); and with
    ``outer``'s traceback where only JAX's own code traced it (``jax.nn.relu``'s body)."""
    tb = inner.traceback
    if tb is not None and not any(_source_info.is_user_filename(c.co_filename)
                                  for c in tb.raw_frames()[0]):
        tb = outer.traceback
    return _source_info.SourceInfo(tb, outer.name_stack + inner.name_stack)


def source_frames(source_info):
    """``(file, line, function)`` of the frames that traced an equation, innermost first, JAX's
    own frames left out (``source_info_util.is_user_filename``)."""
    tb = getattr(source_info, "traceback", None)
    if tb is None:
        return
    codes, offsets = tb.raw_frames()
    for code, offset in zip(codes, offsets):
        if _source_info.is_user_filename(code.co_filename):
            frame = _source_info.raw_frame_to_frame(code, offset)
            yield frame.file_name, frame.start_line, frame.function_name


@contextlib.contextmanager
def traced_as(eqn):
    """Equations traced inside carry ``eqn``'s name stack and traceback: a rewrite's
    replacement stays in the module (and on the line) of the equation it replaces."""
    context = _source_info._source_info_context
    before = context.context
    context.context = before.replace(traceback=eqn.source_info.traceback,
                                     name_stack=eqn.source_info.name_stack)
    try:
        yield
    finally:
        context.context = before


# Graph-break capture records under one float64 setting and replays only under it (jax.jit keys
# its cache on the setting too); the State's own getter is the cheapest read of it.
from jax._src.config import enable_x64 as _enable_x64  # noqa: E402


X64_STATE = _enable_x64  # ``X64_STATE.value``: the setting in this thread


def x64_enabled() -> bool:
    """Whether float64 is on in this thread (``jax.config.jax_enable_x64``, read cheaply)."""
    return _enable_x64.value
