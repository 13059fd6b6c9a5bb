"""How a user's training step will be sharded: validated inputs, layout, rules and semantics.

A user brings ``loss_fn(params, batch) -> scalar``, a parameter pytree (flax variables, an
equinox module), a batch pytree with a leading batch axis, an optax optimizer and optionally
partition rules. :func:`plan` checks all of it with one-line errors, splits the parameters into
trainable float arrays and static leaves (an equinox module's activation functions: they are
closed over, never traced, as ``eqx.partition``/``eqx.combine`` do), places the state
(``layout.py``), and decides what the sharded step computes: the user's own loss when it is
separable over the batch, else data parallelism's per-shard version (``separable.py``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.shard import separability as separable
from mlsys_jax.parallel.shard.layout import Layout, make_layout
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.shard.rules import Placement, apply_rules, megatron_rules

AXES = ("data", "model")
# "Exact" allows this many units of float rounding (eps of the parameters' dtype), relative to
# the largest magnitude of each compared quantity, step by step from the same state (teacher
# forcing, user_step.py). Splitting a batch over devices only reorders sums: one device adds the
# per-example terms in one order, the mesh adds per-shard partial sums. Measured in float32 over
# 3 Adam steps (README "mlsys-jax shard"): loss <= 2.3 eps, gradients <= 7.8 eps (the flax
# transformer on data=8), parameters <= 1 eps; per-shard BatchNorm statistics or dropout masks
# differ by 1e-2 to 1 relative, 1e5-1e7 eps.
ROUNDING_EPS = 16


@dataclass(frozen=True)
class ShardSetup:
    """Everything a sharded run needs, decided and checked before anything is compiled."""

    loss: Callable            # loss(trainable, batch): the user's loss on the static leaves
    step_loss: Callable       # what the sharded step differentiates (loss, or per-shard mean)
    same_loss: Callable       # step_loss for one device (no sharding constraints)
    trainable: object         # parameters with static leaves replaced by None
    rest: object              # the static leaves (None where trainable has an array)
    batch: object
    optimizer: optax.GradientTransformation
    layout: Layout
    placement: Placement
    rules: tuple              # the partition rules used (given or derived)
    rules_derived: bool       # True when megatron_rules derived them
    separability: separable.Separability
    rtol: float               # ROUNDING_EPS * eps of the parameters' dtype


def is_trainable(x) -> bool:
    """A float array (JAX or NumPy): differentiated, updated and sharded."""
    return isinstance(x, (jax.Array, np.ndarray)) and jnp.issubdtype(x.dtype, jnp.inexact)


def split_params(params):
    """``(trainable, rest)``: float arrays, and every other leaf (None at the other's places)."""
    trainable = jax.tree.map(lambda x: x if is_trainable(x) else None, params)
    rest = jax.tree.map(lambda x: None if is_trainable(x) else x, params)
    return trainable, rest


def combine(trainable, rest):
    """The inverse of :func:`split_params`."""
    return jax.tree.map(lambda a, b: b if a is None else a, trainable, rest,
                        is_leaf=lambda x: x is None)


def _check_batch(batch, n: int) -> int:
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


def _check_loss(loss, trainable, batch) -> None:
    try:
        out = jax.eval_shape(loss, trainable, batch)
    except Exception as e:  # the user's code may raise anything while tracing
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise MlsysError(f"loss_fn(params, batch) failed: {type(e).__name__}: {msg}") from None
    if not (hasattr(out, "shape") and out.shape == () and jnp.issubdtype(out.dtype, jnp.inexact)):
        got = getattr(out, "shape", type(out).__name__)
        raise MlsysError(f"loss_fn(params, batch) must return a float scalar, got {got}; return "
                         "the mean of the per-example losses (and nothing else)")


def check_mesh_shape(mesh_shape: dict) -> dict:
    """``{'data': N, 'model': M}`` with only known axes, sizes >= 1, data first."""
    unknown = [a for a in mesh_shape if a not in AXES]
    if unknown or not mesh_shape:
        raise MlsysError(f"mesh axis {unknown[0]!r} is not one of {', '.join(AXES)}; use "
                         "--mesh data=N[,model=M]" if unknown else
                         "the mesh needs an axis: use --mesh data=N[,model=M]")
    return {a: int(mesh_shape[a]) for a in AXES if a in mesh_shape}


def prepare(loss_fn: Callable, params, batch, optimizer, mesh_shape: dict, zero: int = 0,
         rules=None, cache: dict | None = None) -> ShardSetup:
    """Validate a user's step and decide its layout and semantics on ``mesh_shape``.

    ``cache`` (a dict shared by calls on the same step) keeps the separability check per data
    size.
    """
    if not isinstance(optimizer, optax.GradientTransformation):
        raise MlsysError(f"optimizer: expected an optax GradientTransformation (e.g. "
                         f"optax.adamw(1e-3)), got {type(optimizer).__name__}; return one as the "
                         f"factory's 4th item")
    if not callable(loss_fn):
        raise MlsysError(f"loss_fn: expected a function loss_fn(params, batch) -> scalar, got "
                         f"{type(loss_fn).__name__}")
    mesh_shape = check_mesh_shape(mesh_shape)
    mesh = make_mesh(mesh_shape)
    trainable, rest = split_params(params)
    if not jax.tree.leaves(trainable):
        raise MlsysError(f"params: no float arrays to train in {type(params).__name__}; the "
                         "factory's 2nd item must hold the parameters")
    n = mesh_shape.get("data", 1)
    _check_batch(batch, n)
    loss = lambda t, b: loss_fn(combine(t, rest), b)
    _check_loss(loss, trainable, batch)
    m = mesh_shape.get("model", 1)
    derived = rules is None and m > 1
    if derived:
        rules = megatron_rules(trainable, "model", m)
    placement = apply_rules(trainable, list(rules or []), mesh)
    layout = make_layout(trainable, optimizer, batch, mesh, zero, placement.specs)
    dtype = max((x.dtype for x in jax.tree.leaves(trainable)), key=lambda d: jnp.finfo(d).eps)
    rtol = ROUNDING_EPS * float(jnp.finfo(dtype).eps)
    cache = {} if cache is None else cache
    if ("separability", n) not in cache:
        cache[("separability", n)] = separable.check_separable(
            loss, trainable, batch, n, rtol) if n > 1 else \
            separable.Separability(True, 0.0, 0.0, 0.0, (), 0)
    sep = cache[("separability", n)]
    step_loss, same_loss = (loss, loss) if sep.separable else \
        _data_parallel_loss(loss, trainable, batch, layout)
    return ShardSetup(loss, step_loss, same_loss, trainable, rest, batch, optimizer, layout, placement,
                tuple(rules or ()), derived, sep, rtol)


def _data_parallel_loss(loss, trainable, batch, layout: Layout) -> tuple[Callable, Callable]:
    """The loss data parallelism computes, each shard's own loss on its rows averaged: on the
    mesh (shard i on the data axis' device i), and the same on one device."""
    n = layout.data_size
    per_shard, _ = separable.per_shard_losses(loss, trainable, batch, n)
    on_data = NamedSharding(layout.mesh, P(layout.data_axis))

    def on_mesh(t, b):
        shards = jax.lax.with_sharding_constraint(separable.shards_of(b, n),
                                                  jax.tree.map(lambda _: on_data, b))
        return jnp.mean(per_shard(t, shards))
    return on_mesh, lambda t, b: jnp.mean(per_shard(t, separable.shards_of(b, n)))
