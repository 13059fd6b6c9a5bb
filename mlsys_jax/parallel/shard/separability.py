"""Is a loss separable over the batch? From the dataflow, confirmed on the gradients (§5.1).

Data parallelism equals one device when the loss of the whole batch is the mean of the shards'
losses (§2.2: the batch gradient is the mean of per-sample gradients). :func:`check_separable`
decides it in two ways that must agree:

* the structure: ``batch_axis.follow_batch`` names every equation that mixes examples (a batch
  statistic used per example, a loss divided by a batch-wide count, a mask drawn for each
  position of the batch from one key ...); only linear batch-wide sums (the final mean) are
  allowed;
* the numbers: the gradients (and the loss) of the whole batch against those of the mean of the
  per-shard losses, at the given parameters and at seeded perturbed ones, on the example batch and
  on a row-shuffled copy, judged against the noise of an equivalent computation (the whole batch
  with its rows reversed; none where the structure says the rows' order matters). The loss value
  at initial parameters alone can agree by accident: a zero-initialised head makes every
  BatchNorm'd loss equal ``log(classes)``.

The examples sit on dimension 0 of each batch leaf, or on dimension 1 of every leaf of a
time-major loss (``rules.time_major``): shards, shuffles and reversals follow ``batch_axes``.

When the structure mixes examples but the numbers agree, the verdict is *equal on this batch*:
not separable in general, with the reason it holds here (e.g. every shard holds the same count of
non-padding tokens). What the mesh then computes is :mod:`semantics`' business: data parallelism's
per-shard losses, each shard's PRNG keys folded with its index (:func:`per_shard_losses`).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal, bind_equation
from mlsys_jax.ir import eval_jaxpr
from mlsys_jax.parallel.shard.batch import explain as batch_explain
from mlsys_jax.parallel.shard.batch.rules import follow_batch
from mlsys_jax.parallel.shard.compare import FLOOR_EPS, Judgement, leaf_diffs, leaf_scales

_KEY_MAKERS = ("random_wrap", "random_seed")
_ORDERED = ("position", "order", "selection")


@dataclass(frozen=True)
class Separability:
    """The verdict on the loss: structure, numbers, and the sentences that explain them."""

    separable: bool          # in general: linear in the examples (or synchronised), numbers agree
    equal_here: bool         # the gradients agree on this batch (all points)
    summed: bool             # the loss sums over the batch: whole = n x the shards' mean
    mixing: tuple            # batch_axis.Mixing records (synchronised ones included)
    causes: tuple            # one sentence per reason it is not separable
    why_equal: str           # not separable, equal here: why
    whole: float             # loss on the whole batch (given parameters, example batch)
    shards_mean: float       # mean of the shards' losses, same point
    grads: Judgement         # whole-batch vs per-shard gradients over every point
    points: int
    folded_keys: int
    synced: bool = False     # the model's own collectives complete the statistics across shards
    notes: tuple = ()        # what the structure could not decide (the numbers did)

    def summary(self) -> dict:
        return {"separable": self.separable, "equal_on_this_batch": self.equal_here,
                "mixing": [m.describe() for m in self.mixing if not m.synced],
                "synchronised": [m.describe() for m in self.mixing if m.synced],
                "points": self.points, "grads": self.grads.as_json()}


def _axes(batch, axes) -> tuple:
    """Each leaf's batch axis (0 unless ``axes`` says otherwise: 1 for a time-major leaf)."""
    return tuple(axes) if axes is not None else (0,) * len(jax.tree.leaves(batch))


def batch_axes(closed, batch_invars: set, batch) -> tuple:
    """Each batch leaf's axis holding the examples, found from the loss's dataflow
    (``follow_batch``: 1 for every leaf of a time-major loss that scans over dimension 0)."""
    rows = jax.tree.leaves(batch)[0].shape[0]
    walk = follow_batch(closed, batch_invars, rows)
    return tuple(walk.axes.get(v, 0) for v in closed.jaxpr.invars if v in batch_invars)


def _split(x, n: int, a: int):
    shape = tuple(x.shape)
    x = x.reshape(shape[:a] + (n, shape[a] // n) + shape[a + 1:])
    return jnp.moveaxis(x, a, 0) if a else x


def shards_of(batch, n: int, axes=None):
    """The batch's leaves split along their batch axis (``axes``, per leaf; 0 by default) into
    ``n`` blocks stacked on a new leading axis: shard i is row block i."""
    leaves, tree = jax.tree.flatten(batch)
    return tree.unflatten([_split(x, n, a) for x, a in zip(leaves, _axes(batch, axes))])


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def _fold(key, index):
    if key.shape == ():
        return jax.random.fold_in(key, index)
    return jax.vmap(lambda k: jax.random.fold_in(k, index))(key.reshape(-1)).reshape(key.shape)


def per_shard_losses(loss: Callable, trainable, batch, n: int,
                     axes=None) -> tuple[Callable, int]:
    """``f(trainable, shards, order=None) -> (n,)``: each shard's ``loss`` on its rows, the PRNG
    keys the loss holds folded with the shard's index (``order`` permutes the shards, each
    keeping its index; ``f.shard_loss(index, trainable, shard)`` is one shard's). ``axes``: each
    leaf's batch axis (``shards_of``). Returns ``f`` and how many keys it folds."""
    leaves, tree = jax.tree.flatten(batch)
    one = tree.unflatten([jax.ShapeDtypeStruct(
        tuple(s // n if d == a else s for d, s in enumerate(x.shape)), x.dtype)
        for x, a in zip(leaves, _axes(batch, axes))])
    closed = jax.make_jaxpr(loss)(trainable, one)
    key_consts = [i for i, c in enumerate(closed.consts) if _is_key(c)]
    const_vars = _from_constants(closed.jaxpr)
    makers = [e for e in closed.jaxpr.eqns if e.primitive.name in _KEY_MAKERS
              and all(isinstance(v, Literal) or v in const_vars for v in e.invars)]

    def shard_loss(index, t, shard):
        if not key_consts and not makers:
            return loss(t, shard)
        consts = [_fold(c, index) if i in key_consts else c for i, c in enumerate(closed.consts)]

        def handler(eqn, invals):
            if any(eqn is m for m in makers):
                return [_fold(k, index) for k in bind_equation(eqn, invals)]
            return None
        flat = jax.tree.leaves((t, shard))
        return eval_jaxpr(closed.jaxpr, consts, *flat, handler=handler if makers else None)[0]

    def f(t, shards, order=None):
        index = jnp.arange(n)
        if order is not None:
            index = index[jnp.asarray(order)]
            shards = jax.tree.map(lambda x: x[jnp.asarray(order)], shards)
        return jax.vmap(shard_loss, in_axes=(0, None, 0))(index, t, shards)
    f.shard_loss = shard_loss   # one shard's loss: shard_loss(index, trainable, shard)
    return f, len(key_consts) + len(makers)


def _from_constants(jaxpr) -> set:
    """The top-level values computed from the loss's constants and literals alone: a key made
    from them is fixed inside the loss (Keras' SeedGenerator: ``random_wrap(state * 1 + 0)``
    of a non-trainable variable closed over), so each shard's copy is folded with its index."""
    out = set(jaxpr.constvars)
    for eqn in jaxpr.eqns:
        if all(isinstance(v, Literal) or v in out for v in eqn.invars):
            out.update(eqn.outvars)
    return out


def perturbed(trainable, seed: int, size: float = 0.05):
    """Parameters moved by seeded Gaussian noise of ``size`` times each leaf's RMS (``size``
    squared for an all-zero leaf, so zero-initialised heads move off zero). The noise is drawn
    on the host: no program to compile."""
    rng = np.random.default_rng(seed)
    out = []
    for x in jax.tree.leaves(trainable):
        host = np.asarray(x)
        rms = float(np.sqrt(np.mean(np.square(host, dtype=np.float64))))
        scale = size * rms if rms > 0 else size * size
        noise = rng.standard_normal(host.shape, dtype=np.float32) * np.float32(scale)
        out.append(jax.device_put((host + noise).astype(host.dtype)))
        del host, noise
    return jax.tree.unflatten(jax.tree.structure(trainable), out)


@partial(jax.jit, static_argnums=2)
def _rows(batch, order, axes):
    leaves, tree = jax.tree.flatten(batch)
    return tree.unflatten([jnp.take(x, order, axis=a) for x, a in zip(leaves, axes)])


def _count(batch, axes) -> int:
    return jax.tree.leaves(batch)[0].shape[_axes(batch, axes)[0]]


def shuffled(batch, seed: int, axes=None):
    """The batch with its rows (along each leaf's batch axis, ``axes``) in a seeded random
    order."""
    order = np.random.default_rng(seed).permutation(_count(batch, axes))
    return _rows(batch, jnp.asarray(order), _axes(batch, axes))


def reversed_rows(batch, axes=None):
    """The batch with its rows (along each leaf's batch axis) in reverse order."""
    return _rows(batch, jnp.arange(_count(batch, axes))[::-1], _axes(batch, axes))


def check_separable(closed, batch_invars: set, programs: dict, trainable, batch, n: int, *,
                    eps: float, folded: int, synced_axes=(), explain=None, walk=None,
                    points: int = 4) -> Separability:
    """The verdict for a loss traced as ``closed`` at the whole batch.

    ``programs``: compiled ``value_and_grad`` programs ``{"whole": f(t, b), "shards": f(t, b)}``
    (the mean of the per-shard losses, as the mesh computes them); ``folded``: how many PRNG keys
    the per-shard losses fold; ``synced_axes``: axis names bound to the data axis; ``explain``:
    a ``batch_explain.Statistics`` that evaluates batch-wide sums per shard, for the reasons;
    ``walk``: ``follow_batch``'s result, when the caller has it; ``points``: how many of the
    points (given parameters and batch first) the numbers are checked at.
    """
    rows = jax.tree.leaves(batch)[0].shape[0]
    walk = walk or follow_batch(closed, batch_invars, rows, synced_axes)
    axes = tuple(walk.axes.get(v, 0) for v in closed.jaxpr.invars if v in batch_invars)
    whole_fn, shards_fn = programs["whole"], programs["shards"]
    grads, losses = Judgement(), Judgement()
    # rows reversed are not the same mathematics when the loss depends on the rows' order (a
    # cumsum or a scan along the batch, rows sliced, masks following the positions)
    ordered = any(m.kind in _ORDERED for m in walk.mixing)
    count = 0
    for i, (t, b) in enumerate(itertools.islice(_points(trainable, batch, axes), points)):
        count += 1
        lw, gw = whole_fn(t, b)
        ls, gs = shards_fn(t, b)
        if i == 0:   # the yardstick: the same batch with its rows in reverse order
            if ordered:
                noise = ([0.0], [0.0] * len(jax.tree.leaves(gw)))
            else:
                lr, gr = whole_fn(t, reversed_rows(b, axes))
                noise = (leaf_diffs(lw, lr), leaf_diffs(gw, gr))
                del gr
            whole, mean = float(lw), float(ls)
            summed = (n > 1 and _equal_scaled(gw, gs, n, eps, noise[1])
                      and abs(whole - n * mean) <= FLOOR_EPS * eps * abs(whole) + 2 * noise[0][0])
        grads.add(leaf_diffs(gw, gs), noise[1], leaf_scales(gw), eps)
        losses.add(leaf_diffs(lw, ls), noise[0], leaf_scales(lw), eps)
        del gw, gs
    equal_here = grads.within and losses.within
    summed = summed and not equal_here
    causes, notes, why = batch_explain.causes_of(walk, equal_here, summed, grads, folded, explain)
    real = walk.shown_mixing
    return Separability(equal_here and not real and not summed, equal_here, summed,
                        tuple(walk.mixing), tuple(causes), why, whole, mean, grads, count,
                        folded, synced=any(m.synced for m in walk.mixing), notes=tuple(notes))


def _points(trainable, batch, axes):
    """The check's points: the given parameters on the example batch and on a shuffled copy,
    then seeded perturbed parameters on both (drawn only when reached)."""
    yield trainable, batch
    yield trainable, shuffled(batch, 1, axes)
    moved = perturbed(trainable, 2)
    yield moved, batch
    yield moved, shuffled(batch, 3, axes)


def _equal_scaled(gw, gs, n: int, eps: float, noise: list) -> bool:
    j = Judgement()
    j.add(leaf_diffs(gw, jax.tree.map(lambda x: n * x, gs)), noise, leaf_scales(gw), eps)
    return j.within
