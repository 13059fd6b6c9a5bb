"""Everything a sharded run needs, decided and checked before any step is compiled.

:func:`prepare` validates the user's step (``inputs.py``), binds an axis name the model uses to
the data axis (``sync.py``), traces the loss once, decides the tensor-parallel split
(``model_split.py``) and lays out the state (``layout.py``). What the sharded step then computes
depends on the separability verdict: ``semantics.py``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import optax

from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.differentiable import check_grad_traces
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.shard import inputs, model_split, sync
from mlsys_jax.parallel.shard.layout import Layout, make_layout


@dataclass(frozen=True)
class ShardSetup:
    """A user's step, checked and laid out on a mesh."""

    loss: Callable            # loss(trainable, batch): the user's loss on the static leaves
    trainable: object         # parameters with static leaves replaced by None
    rest: object              # the static leaves (None where trainable has an array)
    batch: object
    optimizer: optax.GradientTransformation
    layout: Layout
    split: model_split.ModelSplit
    closed: object            # the loss traced at the whole batch (axis name bound, size 1)
    axis_name: str | None     # the model's own axis name, bound to the data axis
    eps: float                # machine epsilon of the parameters' dtype

    @property
    def data_size(self) -> int:
        return self.layout.data_size

    @property
    def batch_invars(self) -> set:
        n = len(jax.tree.leaves(self.trainable))
        return set(self.closed.jaxpr.invars[n:])

    @functools.cached_property
    def walk(self):
        """The batch axis followed through the loss's equations (``batch.rules.follow_batch``):
        which mix examples."""
        from mlsys_jax.parallel.shard.batch.rules import follow_batch
        rows = jax.tree.leaves(self.batch)[0].shape[0]
        return follow_batch(self.closed, self.batch_invars, rows,
                            (self.axis_name,) if self.axis_name else ())

    @functools.cached_property
    def batch_axes(self) -> tuple:
        """Each batch leaf's axis holding the examples (1 for a time-major leaf), from the
        loss's dataflow (``separability.batch_axes``)."""
        from mlsys_jax.parallel.shard.separability import batch_axes
        return batch_axes(self.closed, self.batch_invars, self.batch)


def prepare(loss_fn: Callable, params, batch, optimizer, mesh_shape: dict, zero: int = 0, *,
            rules=None, axis_rules=None, axis_names: dict | None = None) -> ShardSetup:
    """Validate a user's step and lay it out on ``mesh_shape`` (``{'data': N, 'model': M}``).

    ``rules``: ``(regex, PartitionSpec)`` pairs or logical axis rules; ``axis_rules``: logical
    axis rules (``--axis-rules``); ``axis_names``: ``{name: 'data'}`` for collectives the model
    names (``--axis-name batch=data``; found automatically when one name is unbound).
    """
    inputs.check_step(loss_fn, optimizer)
    mesh_shape = inputs.check_mesh_shape(mesh_shape)
    mesh = make_mesh(mesh_shape)
    trainable, rest = inputs.split_params(params)
    if not jax.tree.leaves(trainable):
        raise MlsysError(f"params: no float arrays to train in {type(params).__name__}; the "
                         "factory's 2nd item must hold the parameters")
    n = mesh_shape.get("data", 1)
    inputs.check_batch(batch, n)

    def loss(t, b):
        return loss_fn(inputs.combine(t, rest), b)

    closed, name = sync.trace_binding(loss, trainable, batch, axis_names)
    if name is None:          # (a loss that names a mesh axis is differentiated on the mesh)
        check_grad_traces(loss, (trainable, batch), what="loss_fn", closed=closed)
    split = model_split.decide(params, trainable, closed, rules, axis_rules, mesh)
    layout = make_layout(trainable, optimizer, batch, mesh, zero, split.specs)
    dtype = max((x.dtype for x in jax.tree.leaves(trainable)), key=lambda d: jnp.finfo(d).eps)
    return ShardSetup(loss, trainable, rest, batch, optimizer, layout, split, closed, name,
                      float(jnp.finfo(dtype).eps))
