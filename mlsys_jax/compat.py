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


def get_aval(x):
    return _core.get_aval(x)


# Graph-break capture (issue 4): the jit primitive (jnp helpers are jit(inline=True)) and the
# effects a compiled segment replays like jax.jit does (jax.debug.print / debug.callback).
from jax.extend.core.primitives import jit_p  # noqa: E402
from jax._src import debugging as _debugging  # noqa: E402

debug_effects = (_debugging.debug_effect, _debugging.ordered_debug_effect)
