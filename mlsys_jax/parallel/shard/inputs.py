"""A user's training step as given, checked: mesh shape, optimizer, batch, loss; trainable arrays
and the static leaves they live beside.

A user brings ``loss_fn(params, batch) -> scalar``, a parameter pytree (flax variables, boxed or
not; an equinox module; a haiku dict; penzai parameter values; Keras variables' values), a batch
pytree with a leading batch axis and an optax optimizer. Every check fails with one line naming the
fix. Float arrays are trained and sharded; every other leaf (an equinox module's activation
functions, a flag) is static: closed over, never traced, as ``eqx.partition``/``eqx.combine`` do.
"""
from __future__ import annotations

import re
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import SHARD_AXES
_UNBOUND = re.compile(r"unbound axis name: ([^\s.,]+)")


class UnboundAxisName(MlsysError):
    """The loss uses an axis name nothing binds (``BatchNorm(axis_name='batch')`` under jit)."""

    def __init__(self, name: str):
        super().__init__(f"the loss uses axis name {name!r} (a collective such as "
                         f"BatchNorm(axis_name={name!r})) that nothing binds; bind it to the data "
                         f"axis with --axis-name {name}=data")
        self.name = name


def is_trainable(x) -> bool:
    """A float array (JAX or NumPy, or its ``ShapeDtypeStruct`` on shapes): differentiated,
    updated and sharded."""
    return (isinstance(x, (jax.Array, np.ndarray, jax.ShapeDtypeStruct))
            and jnp.issubdtype(x.dtype, jnp.inexact))


def split_params(params):
    """``(trainable, rest)``: float arrays, and every other leaf (None at the other's places)."""
    trainable = jax.tree.map(lambda x: x if is_trainable(x) else None, params)
    rest = jax.tree.map(lambda x: None if is_trainable(x) else x, params)
    return trainable, rest


def combine(trainable, rest):
    """The inverse of :func:`split_params`."""
    return jax.tree.map(lambda a, b: b if a is None else a, trainable, rest,
                        is_leaf=lambda x: x is None)


def check_step(loss_fn, optimizer) -> None:
    if not isinstance(optimizer, optax.GradientTransformation):
        raise MlsysError(f"optimizer: expected an optax GradientTransformation (e.g. "
                         f"optax.adamw(1e-3)), got {type(optimizer).__name__}; return one as the "
                         f"factory's 4th item")
    if not callable(loss_fn):
        raise MlsysError(f"loss_fn: expected a function loss_fn(params, batch) -> scalar, got "
                         f"{type(loss_fn).__name__}")


def check_mesh_shape(mesh_shape: dict) -> dict:
    """``{'data': N, 'model': M}`` with only known axes, sizes >= 1, data first."""
    unknown = [a for a in mesh_shape if a not in SHARD_AXES]
    if unknown or not mesh_shape:
        raise MlsysError(f"mesh axis {unknown[0]!r} is not one of {', '.join(SHARD_AXES)}; use "
                         "--mesh data=N[,model=M]" if unknown else
                         "the mesh needs an axis: use --mesh data=N[,model=M]")
    return {a: int(mesh_shape[a]) for a in SHARD_AXES if a in mesh_shape}


def check_batch(batch, n: int) -> int:
    """The batch's row count (every leaf shares a leading axis that ``n`` divides)."""
    leaves = jax.tree.leaves(batch)
    shapes = [tuple(getattr(x, "shape", ())) for x in leaves]
    if not leaves or any(len(s) == 0 for s in shapes) or len({s[0] for s in shapes}) != 1:
        raise MlsysError(f"batch: every leaf needs the same leading batch axis, got shapes "
                         f"{shapes or 'none'}; return e.g. {{'x': x[B, ...], 'y': y[B]}}")
    rows = shapes[0][0]
    if rows % n:
        divisors = [d for d in range(1, rows + 1) if rows % d == 0]
        raise MlsysError(f"the batch of {rows} rows does not split over data={n}; use a batch "
                         f"size divisible by {n} or --mesh data=D with D in {divisors}")
    return rows


def trace_loss(loss: Callable, trainable, batch, axis_env=()):
    """The loss's ClosedJaxpr at ``(trainable, batch)`` with ``axis_env``'s names bound; the
    user's failure or a non-scalar output is one line naming the fix (an unbound axis name:
    :class:`UnboundAxisName`)."""
    try:
        closed = jax.make_jaxpr(loss, axis_env=list(axis_env) or None)(trainable, batch)
    except MlsysError:
        raise
    except NameError as e:
        m = _UNBOUND.search(str(e))
        if m is None:
            raise MlsysError(f"loss_fn(params, batch) failed: NameError: {e}") from None
        raise UnboundAxisName(m[1]) from None
    except Exception as e:  # the user's code may raise anything while tracing
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise MlsysError(f"loss_fn(params, batch) failed: {type(e).__name__}: {msg}") from None
    out = closed.out_avals
    if not (len(out) == 1 and out[0].shape == () and jnp.issubdtype(out[0].dtype, jnp.inexact)):
        got = out[0].shape if len(out) == 1 else f"{len(out)} outputs"
        raise MlsysError(f"loss_fn(params, batch) must return a float scalar, got {got}; return "
                         "the mean of the per-example losses (and nothing else)")
    return closed


def shard_shapes(batch, n: int):
    """ShapeDtypeStructs of one shard of the batch."""
    return with_rows(batch, jax.tree.leaves(batch)[0].shape[0] // n)


def with_rows(batch, rows: int):
    """ShapeDtypeStructs of the batch with ``rows`` on its leading (batch) axis."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct((rows,) + tuple(x.shape[1:]), x.dtype),
                        batch)


def display_path(path: str) -> str:
    """A parameter path as reports show it: a box's ``.value`` left out."""
    return path[: -len(".value")] if path.endswith(".value") else path


def check_finite_loss(loss: Callable, trainable, batch, value=None) -> None:
    """A loss that is NaN or infinite on one device at the initial parameters cannot be compared
    with anything: refused in one line naming where the first non-finite value appears.
    ``value``: the loss there, when a program the caller runs anyway computed it."""
    import jax.numpy as jnp

    from mlsys_jax.ir.nonfinite import first_nonfinite

    if any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves((trainable, batch))):
        return                              # on shapes nothing runs
    if value is None:
        try:
            value = jax.jit(loss)(trainable, batch)
        except Exception:  # noqa: BLE001 (a loss that needs the mesh's axis names: the run says)
            return
    if bool(jnp.isfinite(value)):
        return
    try:
        where = first_nonfinite(jax.make_jaxpr(loss)(trainable, batch), trainable, batch)
    except Exception:  # noqa: BLE001 (named equations need every primitive to run eagerly)
        where = None
    raise MlsysError(f"the loss is {float(value)} on one device at the initial parameters"
                     + (f"; it first appears at {where}" if where else "")
                     + ": exactness needs finite numbers (fix the model, its inputs or its "
                     "initialisation)")
