"""Is a loss separable over the batch, and what data parallelism computes when it is not (§5.1).

Data parallelism equals one device when the loss of the whole batch is the count-weighted mean of
the shards' losses (§2.2: the batch gradient is the mean of per-sample gradients). Losses that
couple the examples break this: training-mode BatchNorm (each shard's own mean and variance), a
loss normalised by a batch statistic or summed instead of averaged, and randomness from one key
the loss closes over (dropout: one device draws one mask for the whole batch; every shard calling
the loss would draw the *same* mask for its rows).

Under ``jax.jit`` with shardings XLA keeps the global program (BatchNorm statistics all-reduced,
as synchronised BN does; one mask for the global batch), which is not what data-parallel training
runs. :func:`per_shard_losses` builds what it runs: each shard's loss on its own rows, averaged, with
each shard's PRNG key folded with its index (``jax.random.fold_in(key, shard)``), so shards draw
different masks. A key the loss closes over is a constant of the loss's jaxpr: the fold happens
there, where the key enters (a typed-key constant, or a ``random_wrap``/``random_seed`` that makes
a key at the top level of the jaxpr).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Literal, bind_equation
from mlsys_jax.ir import eval_jaxpr, primitive_counts
from mlsys_jax.parallel.shard.rules import array_paths

RANDOM_PRIMITIVES = ("random_bits", "threefry2x32")
_KEY_MAKERS = ("random_wrap", "random_seed")
_BATCH_STATS = re.compile(r"batch_stats|BatchNorm|batch_norm|\bbn\d*\b", re.IGNORECASE)


@dataclass(frozen=True)
class Separability:
    """Whole-batch loss against the count-weighted mean of the shards' losses, and why they differ."""

    separable: bool
    whole: float
    shards_mean: float
    tolerance: float
    causes: tuple          # one sentence per cause, when not separable
    folded_keys: int       # PRNG keys that per_shard_losses folds with the shard index


def shards_of(batch, n: int):
    """The batch's leaves reshaped to ``(n, rows / n, ...)``: shard i is row block i."""
    return jax.tree.map(lambda x: x.reshape((n, x.shape[0] // n) + tuple(x.shape[1:])), batch)


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", np.float32), jax.dtypes.prng_key)


def _fold(key, index):
    if key.shape == ():
        return jax.random.fold_in(key, index)
    return jax.vmap(lambda k: jax.random.fold_in(k, index))(key.reshape(-1)).reshape(key.shape)


def per_shard_losses(loss: Callable, trainable, batch, n: int) -> tuple[Callable, int]:
    """``f(trainable, shards) -> (n,)``: each shard's ``loss`` on its rows, keys folded per shard.

    ``shards`` is :func:`shards_of` of a batch like ``batch``. Returns ``f`` and how many keys it
    folds (0: the loss draws no random numbers, or from a key this cannot reach).
    """
    one = jax.tree.map(lambda x: jax.ShapeDtypeStruct((x.shape[0] // n,) + tuple(x.shape[1:]),
                                                      x.dtype), batch)
    closed = jax.make_jaxpr(loss)(trainable, one)
    key_consts = [i for i, c in enumerate(closed.consts) if _is_key(c)]
    const_vars = set(closed.jaxpr.constvars)
    makers = [e for e in closed.jaxpr.eqns if e.primitive.name in _KEY_MAKERS
              and all(isinstance(v, Literal) or v in const_vars for v in e.invars)]

    def shard_loss(index, t, shard):
        consts = [_fold(c, index) if i in key_consts else c for i, c in enumerate(closed.consts)]

        def handler(eqn, invals):
            if any(eqn is m for m in makers):
                return [_fold(k, index) for k in bind_equation(eqn, invals)]
            return None
        flat = jax.tree.leaves((t, shard))
        return eval_jaxpr(closed.jaxpr, consts, *flat, handler=handler if makers else None)[0]

    def f(t, shards):
        return jax.vmap(shard_loss, in_axes=(0, None, 0))(jnp.arange(n), t, shards)
    return f, len(key_consts) + len(makers)


def check_separable(loss: Callable, trainable, batch, n: int, rtol: float) -> Separability:
    """Compare ``loss`` on the whole batch with the mean of its ``n`` shards' losses.

    Equal within ``rtol`` (relative to the loss) means separable. Otherwise the causes are named:
    random numbers drawn inside the loss, a loss that sums over the batch, batch statistics
    (parameter names like ``batch_stats``), or else examples coupled some other way.
    """
    both = jax.jit(lambda t, b: (loss(t, b), jax.vmap(loss, in_axes=(None, 0))(t, shards_of(b, n))))
    whole, shard_losses = both(trainable, batch)
    whole, shard_losses = float(whole), np.asarray(shard_losses, np.float64)
    mean = float(np.mean(shard_losses))
    tol = rtol * max(abs(whole), abs(mean), np.finfo(np.float32).tiny)
    _, folded = per_shard_losses(loss, trainable, batch, n)
    if abs(whole - mean) <= tol:
        return Separability(True, whole, mean, tol, (), folded)
    return Separability(False, whole, mean, tol,
                        _causes(loss, trainable, batch, n, whole, shard_losses, tol, folded),
                        folded)


def _causes(loss, trainable, batch, n, whole, shard_losses, tol, folded) -> tuple:
    one = jax.tree.map(lambda x: x[: x.shape[0] // n], batch)
    prims = primitive_counts(jax.make_jaxpr(loss)(trainable, one))
    causes = []
    if any(p in prims for p in RANDOM_PRIMITIVES):
        how = (f"each shard folds its index into the key (jax.random.fold_in(key, shard)), so "
               f"shards draw different masks" if folded else
               "this run could not reach the key to fold in the shard index, so every shard "
               "draws the same mask: pass the key in as a closed-over jax.random.key")
        causes.append(f"the loss draws random numbers (e.g. dropout) from a PRNG key fixed inside "
                      f"it (closed over or made there): one device draws one mask for the whole "
                      f"batch, data parallelism one per shard; {how}")
    if abs(whole - float(np.sum(shard_losses))) <= tol * n:
        causes.append("the loss sums over the batch instead of averaging (whole-batch loss = sum "
                      "of the shards' losses): data parallelism averages the shards, so its "
                      "gradient is 1/N of one device's; divide the loss by the batch size")
    stats = [p for p, _ in array_paths(trainable) if _BATCH_STATS.search(p)]
    if stats:
        causes.append(f"batch statistics (training-mode BatchNorm: {stats[0]} among the "
                      "parameters): each shard normalises by its own mean and variance, as data "
                      "parallelism without synchronised BatchNorm does")
    if not causes:
        causes.append("the loss couples the examples of a batch (batch statistics, or a loss "
                      "normalised by a batch statistic): each shard computes it on its own rows, "
                      "as data parallelism does")
    return tuple(causes)
