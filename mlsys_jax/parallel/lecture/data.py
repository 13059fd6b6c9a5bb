"""Data parallelism with ``jax.shard_map``: one optax training step over a ``data`` mesh axis.

§2.2/§5.1: the batch gradient is the mean of per-sample gradients, so devices may each take a
slice of the batch and average. Two traps (§11 misconception 5, docs/jax-notes.md "shard_map and meshes"):

* inside shard_map, ``jax.grad`` w.r.t. a replicated (``P()``) parameter is *already* the sum over
  devices (the transpose of the implicit broadcast is a psum) — another psum multiplies by N;
* with uneven shards (10, 10, 10, 2) the mean of per-device means is wrong; weight by counts.

Uneven batches are padded to equal shards with a 0/1 mask; the step divides the (masked) summed
loss by the global count, so padding changes nothing.
"""
from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.axes import DATA
from mlsys_jax.parallel.mesh import require_axes, validate_divisible

LossFn = Callable  # loss_fn(params, x, y) -> mean loss over the batch (a scalar)
REDUCTIONS = ("weighted", "mean_of_means", "double_psum")


def per_example(loss_fn: LossFn) -> Callable:
    """Per-sample losses from a mean loss: vmap it over batches of one (needs no cross-sample ops)."""
    def losses(params, x, y):
        return jax.vmap(lambda xi, yi: loss_fn(params, xi[None], yi[None]))(x, y)
    return losses


def even_counts(n: int, shards: int) -> tuple[int, ...]:
    """How a data loader fills ``shards`` devices with ``n`` samples: ceil(n/shards) each, the rest last."""
    if shards < 1 or n < 1:
        raise MlsysError(f"even_counts: need n >= 1 samples and shards >= 1, got n={n}, shards={shards}")
    per = -(-n // shards)
    return tuple(max(0, min(per, n - i * per)) for i in range(shards))


def pad_shards(x, y, counts: Sequence[int], width: int | None = None):
    """Split a batch into shards of ``counts`` samples, pad each to ``width``, and build the mask.

    Returns numpy ``(x_padded, y_padded, mask)`` with leading size ``len(counts) * width``
    (default width: the largest count), laid out shard after shard so ``P('data')`` hands shard i
    to device i.
    """
    counts = [int(c) for c in counts]
    if any(c < 0 for c in counts) or sum(counts) != len(x) or len(x) != len(y):
        raise MlsysError(f"pad_shards: counts {counts} must be >= 0 and sum to the batch size "
                         f"{len(x)} (x and y: {len(x)} and {len(y)} rows)")
    x, y = np.asarray(x), np.asarray(y)  # host-side layout work: no device ops to compile
    width = max(max(counts), 1) if width is None else int(width)
    if width < max(counts):
        raise MlsysError(f"pad_shards: width {width} is smaller than the largest shard {max(counts)}")
    starts = np.cumsum([0] + counts[:-1])
    pad = lambda a, s, c: np.pad(a[s:s + c], [(0, width - c)] + [(0, 0)] * (a.ndim - 1))
    mask = [np.arange(width) < c for c in counts]
    return (np.concatenate([pad(x, s, c) for s, c in zip(starts, counts)]),
            np.concatenate([pad(y, s, c) for s, c in zip(starts, counts)]),
            np.concatenate(mask).astype(x.dtype))


def make_single_step(loss_fn: LossFn, optimizer: optax.GradientTransformation) -> Callable:
    """The single-device reference: ``step(params, opt_state, x, y) -> (params, opt_state, loss, grads)``."""
    @jax.jit
    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads
    return step


def dp_grads_fn(loss_fn: LossFn, mesh: Mesh, axis: str = DATA, reduction: str = "weighted"):
    """``grads(params, x, y, mask) -> (loss, grads)`` under shard_map, for one of ``REDUCTIONS``.

    ``weighted`` is correct; ``mean_of_means`` is the naive per-device average (wrong for uneven
    shards); ``double_psum`` psums the already-summed gradient (N times too large).
    """
    require_axes(mesh, axis, api="data parallel")
    if reduction not in REDUCTIONS:
        raise MlsysError(f"data parallel: reduction {reduction!r} is not one of {REDUCTIONS}")
    losses = per_example(loss_fn)

    def local(params, x, y, mask):
        if reduction == "mean_of_means":
            # each device's own mean gradient: differentiate a device-local copy of the params
            own = lax.pcast(params, axis, to="varying")
            local_mean = lambda p: jnp.sum(losses(p, x, y) * mask) / jnp.sum(mask)
            loss, g = jax.value_and_grad(local_mean)(own)
            return lax.pmean(loss, axis), lax.pmean(g, axis)
        count = lax.psum(jnp.sum(mask), axis)                       # §5.1: true global count
        local_sum = lambda p: jnp.sum(losses(p, x, y) * mask)
        loss, g = jax.value_and_grad(local_sum)(params)             # g: already psum'ed over axis
        if reduction == "double_psum":
            g = jax.tree.map(lambda t: lax.psum(t, axis), g)         # the trap: N x too large
        return lax.psum(loss, axis) / count, jax.tree.map(lambda t: t / count, g)

    # jit: an un-jitted shard_map runs op by op, compiling every primitive on its own
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P(axis), P(axis), P(axis)),
                                 out_specs=(P(), P())))


def make_dp_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, mesh: Mesh,
                 axis: str = DATA, reduction: str = "weighted") -> Callable:
    """``step(params, opt_state, x, y, mask) -> (params, opt_state, loss, grads)``, data parallel.

    ``x``, ``y``, ``mask`` have a leading size divisible by the axis (use :func:`pad_shards`);
    params and optimizer state are replicated and updated identically on every device.
    """
    grads_fn = dp_grads_fn(loss_fn, mesh, axis, reduction)
    size = int(mesh.shape[axis])

    @jax.jit
    def step(params, opt_state, x, y, mask):
        loss, grads = grads_fn(params, x, y, mask)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    def checked(params, opt_state, x, y, mask=None):
        validate_divisible(len(x), size, f"data parallel: batch of {len(x)} over axis {axis!r}")
        if mask is None:
            mask = np.ones(len(x), x.dtype)
        return step(params, opt_state, x, y, mask)

    checked.jitted = step
    return checked


def shard_batch(mesh: Mesh, axis: str, *arrays):
    """Place arrays on the mesh, split along their first dimension over ``axis``."""
    sharding = NamedSharding(mesh, P(axis))
    return tuple(jax.device_put(a, sharding) for a in arrays)


def max_abs_diff(a, b) -> float:
    """Largest absolute difference between two pytrees of arrays (same structure), on the host."""
    diffs = jax.tree.leaves(jax.tree.map(
        lambda u, v: float(np.max(np.abs(np.asarray(u) - np.asarray(v)), initial=0.0)), a, b))
    return float(np.max(diffs)) if diffs else 0.0  # (np.max: a NaN in any leaf is kept)


def flatten(tree) -> np.ndarray:
    """Host copy of a pytree as one vector, in ``ravel_pytree``'s leaf order."""
    return np.concatenate([np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(tree)])


def demo_problem(seed: int = 0, batch: int = 32, sizes: Sequence[int] = (16, 32, 4),
                 dtype=np.float64):
    """A small classifier for ``models.mlp_loss`` (its ``W1, b1, ...`` layout) and a random batch.

    Drawn with numpy: XLA compiles each eager ``jax.random`` op, seconds for a few small arrays.
    """
    rng = np.random.default_rng(seed)
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"W{i}"] = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(dtype)
        params[f"b{i}"] = (0.1 * rng.standard_normal(n_out)).astype(dtype)
    x = rng.standard_normal((batch, sizes[0])).astype(dtype)
    y = np.eye(sizes[-1], dtype=dtype)[rng.integers(0, sizes[-1], batch)]
    return params, x, y
