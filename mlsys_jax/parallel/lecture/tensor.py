"""Tensor (model) parallelism with ``jax.shard_map``: split the matrices, not the data (§5.2).

* column split of W (Y = X [W_1 .. W_n]): each device computes some columns of Y; all-gather.
* row split of W with X split by columns: each device computes a full-shape partial sum; all-reduce.
* Megatron MLP: first matrix by columns, relu on the local columns, second matrix by rows — the
  split of the first feeds the second, so the forward needs exactly one all-reduce.
* sequence parallel: tokens split over devices outside the MLP; all-gather in, reduce-scatter out
  (the all-reduce cut in its two halves).
* the wrong split: first matrix by rows and relu *before* the sum — relu(a)+relu(b) != relu(a+b).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mlsys_jax.parallel.mesh import require_axes, validate_divisible

MLP_KEYS = ("w1", "b1", "w2", "b2")


def mlp_init(seed: int, d_model: int, d_hidden: int, dtype=np.float64) -> dict:
    """A two-matrix MLP block {w1 [d, h], b1 [h], w2 [h, d], b2 [d]} (numpy draws: no compiles)."""
    rng = np.random.default_rng(seed)
    normal = lambda *shape: rng.standard_normal(shape).astype(dtype)
    return {"w1": normal(d_model, d_hidden) / np.sqrt(d_model), "b1": 0.1 * normal(d_hidden),
            "w2": normal(d_hidden, d_model) / np.sqrt(d_hidden), "b2": 0.1 * normal(d_model)}


def mlp_reference(params: dict, x):
    """The unsplit MLP: relu(x W1 + b1) W2 + b2."""
    return jax.nn.relu(x @ params["w1"] + params["b1"]) @ params["w2"] + params["b2"]


def megatron_specs(axis: str) -> dict:
    """Column split for w1/b1, row split for w2, b2 replicated (§5.2)."""
    return {"w1": P(None, axis), "b1": P(axis), "w2": P(axis, None), "b2": P()}


def column_parallel(mesh: Mesh, axis: str = "tensor") -> Callable:
    """``f(x, w) -> x @ w`` with w split by columns; the column blocks are all-gathered.

    Like every function here it is a plain shard_map function: wrap it in ``jax.jit`` to run.
    """
    require_axes(mesh, axis, api="column_parallel")

    def local(x, w_cols):
        return lax.all_gather(x @ w_cols, axis, axis=1, tiled=True)
    # all_gather's result is typed "varying" though every device holds the same full Y, so the
    # replicated out_spec needs check_vma=False (docs/jax-notes.md "shard_map and meshes").
    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(), P(None, axis)), out_specs=P(),
                       check_vma=False)
    return _validated(fn, mesh, axis, lambda x, w: [("columns of w", w.shape[1])])


def row_parallel(mesh: Mesh, axis: str = "tensor") -> Callable:
    """``f(x, w) -> x @ w`` with w split by rows and x by columns; partial sums all-reduced."""
    require_axes(mesh, axis, api="row_parallel")

    def local(x_cols, w_rows):
        return lax.psum(x_cols @ w_rows, axis)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(None, axis), P(axis, None)), out_specs=P())
    return _validated(fn, mesh, axis, lambda x, w: [("rows of w", w.shape[0])])


def megatron_mlp(mesh: Mesh, axis: str = "tensor") -> Callable:
    """``f(params, x)``: column-parallel then row-parallel MLP, one all-reduce in the forward."""
    require_axes(mesh, axis, api="megatron_mlp")

    def local(p, x):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])          # local columns: relu needs no exchange
        return lax.psum(h @ p["w2"], axis) + p["b2"]    # the one all-reduce
    fn = jax.shard_map(local, mesh=mesh, in_specs=(megatron_specs(axis), P()), out_specs=P())
    return _validated(fn, mesh, axis, lambda p, x: [("hidden size", p["w1"].shape[1])])


def wrong_split_mlp(mesh: Mesh, axis: str = "tensor") -> Callable:
    """The wrong split: w1 by rows (x by columns) and relu applied to the partial sums."""
    require_axes(mesh, axis, api="wrong_split_mlp")
    n = int(mesh.shape[axis])

    def local(p, x_cols):
        h = lax.psum(jax.nn.relu(x_cols @ p["w1"] + p["b1"] / n), axis)  # relu before the sum
        return h @ p["w2"] + p["b2"]
    specs = {"w1": P(axis, None), "b1": P(), "w2": P(), "b2": P()}
    fn = jax.shard_map(local, mesh=mesh, in_specs=(specs, P(None, axis)), out_specs=P())
    return _validated(fn, mesh, axis, lambda p, x: [("input features", x.shape[1])])


def sequence_parallel_mlp(mesh: Mesh, axis: str = "tensor") -> Callable:
    """``f(params, x)`` with x [tokens, d] split by tokens in and out: all-gather, MLP, reduce-scatter."""
    require_axes(mesh, axis, api="sequence_parallel_mlp")

    def local(p, x_tokens):
        x = lax.all_gather(x_tokens, axis, axis=0, tiled=True)
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        y = lax.psum_scatter(h @ p["w2"], axis, scatter_dimension=0, tiled=True)
        return y + p["b2"]
    fn = jax.shard_map(local, mesh=mesh, in_specs=(megatron_specs(axis), P(axis, None)),
                       out_specs=P(axis, None))
    return _validated(fn, mesh, axis, lambda p, x: [("tokens", x.shape[0]),
                                                    ("hidden size", p["w1"].shape[1])])


def _validated(fn: Callable, mesh: Mesh, axis: str, sizes: Callable) -> Callable:
    """``fn`` preceded by our divisibility check of the split dimensions (static shapes only)."""
    n = int(mesh.shape[axis])

    def checked(*args):
        for what, size in sizes(*args):
            validate_divisible(int(size), n, f"tensor parallel: {what} over axis {axis!r}")
        return fn(*args)
    checked.__name__ = checked.__qualname__ = getattr(fn, "__name__", "tensor_parallel")
    return checked


def shard_mlp_params(params: dict, mesh: Mesh, axis: str = "tensor") -> dict:
    """Place MLP params on the mesh with the Megatron split (validating the hidden size)."""
    validate_divisible(params["w1"].shape[1], int(mesh.shape[axis]),
                       f"tensor parallel: hidden size over axis {axis!r}")
    specs = megatron_specs(axis)
    return {k: jax.device_put(params[k], NamedSharding(mesh, specs[k])) for k in MLP_KEYS}


def mse(pred, target):
    """Mean squared error."""
    return jnp.mean((pred - target) ** 2)


def make_tp_step(optimizer: optax.GradientTransformation, mesh: Mesh,
                 axis: str = "tensor") -> Callable:
    """``step(params, opt_state, x, t) -> (params, opt_state, loss, grads)`` with a Megatron MLP.

    Gradients of the split weights are computed where the weights live; the optimizer (elementwise)
    updates each shard in place — the same numbers as the single-device step.
    """
    forward = megatron_mlp(mesh, axis)

    @jax.jit
    def step(params, opt_state, x, t):
        loss, grads = jax.value_and_grad(lambda p: mse(forward(p, x), t))(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads
    return step


def reference_loss(params: dict, x, t):
    """Single-device loss of the same MLP (for :func:`data.make_single_step`)."""
    return mse(mlp_reference(params, x), t)
