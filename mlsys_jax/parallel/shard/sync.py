"""Axis names a model binds itself: synchronised BatchNorm and other collectives over the batch.

flax's ``BatchNorm(axis_name='batch')`` (its imagenet example) averages its statistics with
``lax.pmean(..., 'batch')``: the example pmaps its step over an axis of that name. Under a plain
``jax.jit`` that name is unbound (JAX raises ``NameError: unbound axis name: batch``). Here the
name is bound to the mesh's ``data`` axis: the mesh runs the loss per shard inside
``jax.shard_map`` over ``data``, with the model's collectives over that name renamed to ``data``,
so its statistics are global — synchronised BatchNorm. On one device the same name is bound to a
``vmap`` axis: of size one over the whole batch (whole-batch statistics, the reference), or over
the shards (the mesh's computation, shard by shard: its twin).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.ir import bodies, eval_jaxpr
from mlsys_jax.parallel.shard.inputs import UnboundAxisName, trace_loss

_COLLECTIVES = {"psum": jax.lax.psum, "pmax": jax.lax.pmax, "pmin": jax.lax.pmin}


def trace_binding(loss: Callable, trainable, batch, given: dict | None):
    """``(closed, name)``: the loss traced at the whole batch with the axis name it uses bound
    (to an axis of size one), and that name (None when it binds every name it uses)."""
    names: list = []
    for _ in range(8):
        try:
            closed = trace_loss(loss, trainable, batch, [(n, 1) for n in names])
            break
        except UnboundAxisName as e:
            if e.name in names:
                raise
            names.append(e.name)
    name = resolve(tuple(names), given)
    return closed, name


def resolve(names: tuple, given: dict | None) -> str | None:
    """The one axis name to bind to ``data``: the given ``--axis-name NAME=data``, or the only
    unbound one. None when the loss binds every name it uses."""
    given = dict(given or {})
    bad = {k: v for k, v in given.items() if v != "data"}
    if bad:
        k, v = next(iter(bad.items()))
        raise MlsysError(f"--axis-name {k}={v}: a model's axis name can only be bound to the "
                         "mesh's data axis here; use --axis-name NAME=data")
    left = [n for n in names if n not in given]
    if len(names) > 1 or (given and left):
        raise MlsysError(f"the loss uses unbound axis names {', '.join(names)}; only one can be "
                         "bound to the data axis (--axis-name NAME=data)")
    if given and not names:
        raise MlsysError(f"--axis-name {next(iter(given))}=data: the loss uses no such axis "
                         "name (it runs under plain jax.jit); leave --axis-name out")
    return names[0] if names else None


def whole_batch(loss: Callable, name: str) -> Callable:
    """The loss on the whole batch with ``name`` bound to an axis of size one (a collective over
    it is the identity): one device's synchronised statistics are the batch's own."""
    def f(t, b):
        one = jax.tree.map(lambda x: x[None], b)
        return jax.vmap(lambda bb: loss(t, bb), axis_name=name)(one)[0]
    return f


def over_shards(loss: Callable, name: str, shards_of: Callable, n: int, order=None) -> Callable:
    """The mesh's computation on one device: each shard's loss with ``name`` bound across the
    shards (a vmap axis), averaged. ``order`` permutes the shards (the same mathematics)."""
    def f(t, b):
        shards = shards_of(b, n)
        if order is not None:
            shards = jax.tree.map(lambda x: x[jnp.asarray(order)], shards)
        return jnp.mean(jax.vmap(lambda s: loss(t, s), axis_name=name)(shards))
    return f


def on_mesh(loss: Callable, trainable, shard_batch, name: str, mesh, data_axis: str) -> Callable:
    """The loss as the mesh runs it: per shard inside ``shard_map`` over ``data_axis``, the
    model's collectives over ``name`` renamed to ``data_axis``, the shards' losses averaged.
    ``shard_batch`` holds one shard's shapes."""
    n = int(mesh.shape[data_axis])
    closed = jax.make_jaxpr(loss, axis_env=[(name, n)])(trainable, shard_batch)

    def per_shard(t, b):
        out = _eval_renamed(closed.jaxpr, closed.consts, jax.tree.leaves((t, b)), name, data_axis)
        return jax.lax.pmean(out[0], data_axis)

    def f(t, b):
        # the loss's own primitives are bound as traced, without vmap's varying-axis casts
        return jax.shard_map(per_shard, mesh=mesh, in_specs=(P(), P(data_axis)), out_specs=P(),
                             axis_names={data_axis}, check_vma=False)(t, b)
    return f


def _mentions(jaxpr, name: str) -> bool:
    for eqn in jaxpr.eqns:
        axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
        if name in (axes if isinstance(axes, (tuple, list)) else (axes,)):
            return True
        if any(_mentions(b.jaxpr, name) for b in bodies(eqn)):
            return True
    return False


def _eval_renamed(jaxpr, consts, args, name: str, axis: str) -> list:
    """Evaluate ``jaxpr`` with collectives over ``name`` taken over ``axis`` instead; a call whose
    body holds one is evaluated inline (its other equations bind as they are)."""
    def handler(eqn, invals):
        prim = eqn.primitive.name
        if prim in _COLLECTIVES and name in eqn.params["axes"]:
            axes = tuple(axis if a == name else a for a in eqn.params["axes"])
            return [_COLLECTIVES[prim](x, axes) for x in invals]
        if prim == "axis_index" and eqn.params["axis_name"] == name:
            return [jax.lax.axis_index(axis)]
        found = bodies(eqn)
        if len(found) == 1 and _mentions(found[0].jaxpr, name):
            b = found[0]
            if len(b.jaxpr.invars) != len(invals):
                raise MlsysError(f"cannot bind axis {name!r} inside {prim}: its collectives sit "
                                 "in a body this runner cannot inline")
            return _eval_renamed(b.jaxpr, b.consts, invals, name, axis)
        if any(_mentions(b.jaxpr, name) for b in found):
            raise MlsysError(f"cannot bind axis {name!r} inside {prim} (a loop or branch over "
                             "synchronised statistics)")
        return None
    return eval_jaxpr(jaxpr, consts, *args, handler=handler)


__all__ = ["trace_binding", "resolve", "whole_batch", "over_shards", "on_mesh"]
