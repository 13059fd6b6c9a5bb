"""Models on shapes: a factory's arrays as ``jax.ShapeDtypeStruct`` leaves, nothing allocated.

A factory at 8B parameters cannot build its arrays on a laptop, and none of the questions asked
of it at that size (FLOPs, XLA's bytes per device, collectives) needs their values. Two ways in:
a factory may return ``ShapeDtypeStruct`` leaves itself (flax's ``init`` under
``jax.eval_shape``, ``nnx.eval_shape``, ``eqx.filter_eval_shape``), or any concrete factory runs
under :func:`run_abstract`, which traces it with ``jax.eval_shape``: every array it creates is a
tracer, its array outputs come back as structs and everything else it returns (the model's
``apply``, a loss function, an optax optimizer) is kept as it is.

>>> import jax, jax.numpy as jnp
>>> def factory():
...     w = jax.random.normal(jax.random.key(0), (4096, 4096), jnp.float32)
...     return (lambda w, x: x @ w), (w, jnp.ones((8, 4096)))
>>> f, (w, x) = run_abstract(factory)
>>> w
ShapeDtypeStruct(shape=(4096, 4096), dtype=float32)
>>> is_abstract((w, x)), is_abstract(jnp.ones(2))
(True, False)
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

from mlsys_jax.errors import MlsysError


def _is_array(x) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def run_abstract(factory: Callable[[], Any]) -> Any:
    """Call ``factory()`` with array creation traced; its array leaves return as structs.

    Raises :class:`MlsysError` (one line, the fix named) when the factory needs a concrete value
    of an array it created (``np.asarray``, ``float()``, a Python ``if`` on an array).
    """
    kept: dict = {}

    def arrays_of_factory():
        leaves, treedef = jax.tree_util.tree_flatten(factory())
        kept.update(leaves=leaves, treedef=treedef)
        return [x for x in leaves if _is_array(x)]

    try:
        structs = iter(jax.eval_shape(arrays_of_factory))
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
            jax.errors.TracerIntegerConversionError) as e:
        raise _needs_values(e) from e
    leaves = [next(structs) if _is_array(x) else x for x in kept["leaves"]]
    return jax.tree_util.tree_unflatten(kept["treedef"], leaves)


def _needs_values(e: Exception) -> MlsysError:
    from mlsys_jax.ir.provenance import raised_at

    where = raised_at(e)
    return MlsysError(f"--abstract: the factory needs the value of an array it created"
                      f"{' at ' + where if where else ''} ({type(e).__name__}); on shapes no "
                      f"array has a value: compute that from shapes (x.shape, x.dtype) or with "
                      f"jnp instead of NumPy, or run without --abstract at a size that fits")


def shapes_of(tree):
    """``tree`` with every array leaf (or struct) as a ``ShapeDtypeStruct``: its shapes only."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)
                                  if hasattr(x, "shape") and hasattr(x, "dtype") else x, tree)


def is_abstract(tree) -> bool:
    """True when ``tree`` has array leaves and all of them are ``ShapeDtypeStruct``s."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree)
              if isinstance(x, jax.ShapeDtypeStruct) or _is_array(x)]
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
