"""An unknown user primitive (docs/verification.md §5): the passes must treat it as opaque.

``fuzz_opaque(x) = sin(x) + x`` (integers: ``3x + 1``), registered like a user's custom op (impl,
abstract eval, lowering, JVP) — but it is in no pass's table of known pure primitives, so nothing
may fold or rewrite it.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

opaque_p = Primitive("fuzz_opaque")


def _impl(x):
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return x * 3 + 1
    return jnp.sin(x) + x


opaque_p.def_impl(_impl)
opaque_p.def_abstract_eval(lambda x: jax.core.ShapedArray(x.shape, x.dtype, weak_type=x.weak_type))
mlir.register_lowering(opaque_p, mlir.lower_fun(_impl, multiple_results=False))
ad.defjvp(opaque_p, lambda g, x: g * (jnp.cos(x) + 1))
batching.defvectorized(opaque_p)


def opaque(x):
    """Apply the unknown primitive."""
    return opaque_p.bind(x)
