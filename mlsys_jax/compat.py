"""The one module that touches ``jax._src`` or version-specific JAX details (JAX 0.10.x).

Everything else in mlsys_jax imports these names from here, so a JAX upgrade is fixed in one file.
"""
from __future__ import annotations

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

# Custom traces (graph-break capture, issue 4): JAX's tracing machinery.
Trace = _core.Trace
Tracer = _core.Tracer
set_current_trace = _core.set_current_trace
eval_trace = getattr(_core, "eval_trace", None)
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


def nested_jaxprs(eqn):
    """(param name, index or None, Jaxpr, consts) for every jaxpr in an equation's params."""
    out = []
    for name, val in eqn.params.items():
        items = val if isinstance(val, (tuple, list)) else (val,)
        for i, item in enumerate(items):
            idx = i if isinstance(val, (tuple, list)) else None
            if isinstance(item, ClosedJaxpr):
                out.append((name, idx, item.jaxpr, item.consts))
            elif isinstance(item, Jaxpr):
                out.append((name, idx, item, ()))
    return out


def varying_axes(x) -> frozenset:
    """Mesh axes over which ``x`` varies inside shard_map (JAX 0.10: ``aval.manual_axis_type``;
    older releases called it ``aval.vma``). Empty outside shard_map."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None:
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()))


# Graph-break capture (issue 4): the effects a compiled segment replays like jax.jit does
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


# Passes (issue 3): JAX's own dead-code elimination, which keeps effectful equations and prunes
# nested bodies (jit, scan, cond, while, remat) through their registered DCE rules.
dce_jaxpr_consts = _pe.dce_jaxpr_consts


# Remat planner (issue 5): the residuals a VJP keeps, each with its source ("named 'v3' from …",
# "from the argument …"); jax.ad_checkpoint only exports the printing form.
from jax._src.ad_checkpoint import saved_residuals  # noqa: E402,F401


# Graph-break capture's warm calls and one-program replay (execute/capture.py, _fuse.py): the
# concrete array type (a warm call's fast path keys arguments by their cached ``aval``), and zeros
# of an exact abstract type, weak type included (the "outcome not seen yet" branch must return the
# same types as the others; jnp.zeros is always strongly typed).
from jax._src.array import ArrayImpl  # noqa: E402,F401
from jax._src.lax.lax import _convert_element_type  # noqa: E402


def zeros_of(aval):
    """Traced zeros with ``aval``'s shape, dtype and weak type."""
    z = jax.lax.full(aval.shape, 0, aval.dtype)
    return _convert_element_type(z, aval.dtype, weak_type=True) if aval.weak_type else z
