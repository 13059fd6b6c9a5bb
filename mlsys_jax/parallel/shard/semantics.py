"""What the sharded step computes, and the one-device computations it is judged against.

* **global** — the loss is separable: the mesh runs the user's loss as one global program
  (``jax.jit`` partitions it); the reference is one device on the whole batch, the *twin* (a
  second, mathematically equal computation that measures the rounding noise) the mean of the
  per-shard losses.
* **per-shard** — it is not: the mesh runs what data parallelism runs, each shard's loss on its
  own rows (own BatchNorm statistics, own normaliser; PRNG keys folded with the shard index),
  averaged; the reference is that on one device (a vmap over the shards), the twin a loop over
  the shards, one compiled shard at a time, as the mesh's devices run them.
* **synchronised** — the model names an axis (``BatchNorm(axis_name='batch')``) bound to the
  data axis: the mesh runs the loss per shard with the model's collectives over the shards
  (``sync.on_mesh``); on one device the name binds to a vmap over the shards. When that makes the
  loss equal the whole batch's (synchronised BatchNorm), the reference is the whole batch.

With a single data shard (a model-only mesh) the twin is the whole batch with its rows reversed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mlsys_jax.parallel.shard import sync
from mlsys_jax.parallel.shard.inputs import shard_shapes
from mlsys_jax.parallel.shard.separability import per_shard_losses, shards_of


@dataclass(frozen=True)
class StepSemantics:
    """The losses of one sharded run (each ``f(trainable, batch) -> scalar``)."""

    kind: str              # "global", "per-shard" or "synchronised"
    whole: Callable        # one device, whole batch: the trajectory every report compares with
    reference: str         # which one-device loss the mesh must equal: a key of ``losses``
    twin: str              # its equivalent computation (the noise): a key of ``losses``
    mesh: Callable         # what the sharded step differentiates
    losses: dict           # name -> one-device loss
    folded: int            # PRNG keys folded per shard


def one_device_losses(setup) -> tuple[dict, int]:
    """``({"whole", "shards", "shards_reordered", "rows_reversed", "_per"}: loss, folded keys)``:
    one-device losses by name (``_per``: the per-shard losses, ``per_shard_losses``' ``f``)."""
    loss, n, name = setup.loss, setup.data_size, setup.axis_name
    order = list(range(n))[::-1]
    out = {"whole": loss if name is None else sync.whole_batch(loss, name)}
    out["rows_reversed"] = (lambda t, b, f=out["whole"]:
                            f(t, jax.tree.map(lambda x: x[::-1], b)))
    folded = 0
    if n > 1 and name is not None:
        out["shards"] = sync.over_shards(loss, name, shards_of, n)
        out["shards_reordered"] = sync.over_shards(loss, name, shards_of, n, order)
    elif n > 1:
        per, folded = per_shard_losses(loss, setup.trainable, setup.batch, n)
        out["shards"] = lambda t, b: jnp.mean(per(t, shards_of(b, n)))
        out["shards_reordered"] = lambda t, b: jnp.mean(per(t, shards_of(b, n), order))
        out["_per"] = per
    return out, folded


def choose(setup, separable: bool, losses: dict, folded: int, positional: bool) -> StepSemantics:
    """The semantics for a separability verdict (``separable`` is ignored with a single data
    shard; ``positional``: the loss draws masks for batch positions)."""
    layout, n = setup.layout, setup.data_size
    if n == 1:
        twin = "whole" if positional else "rows_reversed"
        return StepSemantics("global", losses["whole"], "whole", twin, setup.loss, losses, 0)
    if setup.axis_name is not None:
        mesh = sync.on_mesh(setup.loss, setup.trainable, shard_shapes(setup.batch, n),
                            setup.axis_name, layout.mesh, layout.data_axis)
        ref, twin = ("whole", "shards") if separable else ("shards", "shards_reordered")
        return StepSemantics("synchronised", losses["whole"], ref, twin, mesh, losses, folded)
    if separable:
        return StepSemantics("global", losses["whole"], "whole", "shards", setup.loss, losses,
                             folded)
    per = losses["_per"]
    on_data = NamedSharding(layout.mesh, P(layout.data_axis))

    def on_mesh(t, b):  # shard i on the data axis' device i
        shards = jax.lax.with_sharding_constraint(shards_of(b, n),
                                                  jax.tree.map(lambda _: on_data, b))
        return jnp.mean(per(t, shards))
    return StepSemantics("per-shard", losses["whole"], "shards", "shards_loop", on_mesh,
                         losses, folded)
