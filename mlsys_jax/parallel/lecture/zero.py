"""ZeRO stages 1-3 over the ``data`` axis: shard what data parallelism replicates (§7.3).

Plain DP keeps on every device a full copy of the parameters (Ψ), gradients (Ψ) and Adam state
(2Ψ). ZeRO shards, over N devices: stage 1 the optimizer state, stage 2 also the gradients
(reduce-scatter instead of all-reduce), stage 3 also the parameters (all-gathered for the
forward/backward). Memory is traded for communication (§7.4) — the numbers stay those of DP.

Parameters are handled as one flat vector (padded to a multiple of N) so a shard is a slice;
``per_device_bytes`` gives the formulas, :func:`measure` reads ``memory_analysis()`` of the
compiled step (per device on a mesh, docs/jax-notes.md "shard_map and meshes").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import stages
from mlsys_jax.parallel.axes import DATA
from mlsys_jax.parallel.lecture.data import per_example
from mlsys_jax.parallel.mesh import require_axes
# the stage numbers (0 = plain data parallel, flat layout, for comparison), from the one table
from mlsys_jax.parallel.stages import STAGE_NUMBERS as STAGES


@dataclass(frozen=True)
class ZeroStep:
    """A compiled-ready ZeRO step and how to move between pytree params and its flat layout."""

    stage: int
    step: Callable          # jitted: (flat, opt_state, x, y, mask) -> (flat, opt_state, loss, grads)
    init: Callable          # params pytree -> (flat placed on the mesh, opt_state placed)
    unflatten: Callable     # flat (possibly padded) -> params pytree
    n_params: int           # Ψ
    padded: int             # Ψ rounded up to a multiple of N


def _opt_specs(opt_state, axis: str):
    return jax.tree.map(lambda a: P() if jnp.ndim(a) == 0 else P(axis), opt_state)


def make_zero_step(loss_fn: Callable, optimizer: optax.GradientTransformation, params,
                   mesh: Mesh, stage: int, axis: str = DATA) -> ZeroStep:
    """A data-parallel training step with ZeRO ``stage`` (0-3); same result as plain DP."""
    require_axes(mesh, axis, api="ZeRO")
    if stage not in STAGES:
        raise MlsysError(f"ZeRO: stage must be one of {STAGES} (0 = plain DP), got {stage!r}")
    n = int(mesh.shape[axis])
    flat0, unravel = _ravel_abstract(params)
    psi = int(flat0.shape[0])
    padded = -(-psi // n) * n
    k = padded // n
    losses = per_example(loss_fn)
    splits = stages.zero_stage(stage)
    shard_opt, shard_grads, shard_params = splits.optimizer, splits.grads, splits.params

    def local(flat, opt_state, x, y, mask):
        me = lax.axis_index(axis)
        count = lax.psum(jnp.sum(mask), axis)
        full = lax.all_gather(flat, axis, tiled=True) if shard_params else flat
        masked_sum = lambda f: jnp.sum(losses(unravel(f[:psi]), x, y) * mask)
        if shard_params:  # grad through all_gather = reduce-scatter of the local grads
            loss, g = jax.value_and_grad(lambda s: masked_sum(
                lax.all_gather(s, axis, tiled=True)))(flat)
        else:             # check_vma=False: the local gradient, reduced explicitly below
            loss, g = jax.value_and_grad(masked_sum)(full)
            g = lax.psum_scatter(g, axis, tiled=True) if shard_grads else lax.psum(g, axis)
        g = g / count
        loss = lax.psum(loss, axis) / count
        if not shard_opt:
            updates, opt_state = optimizer.update(g, opt_state, flat)
            return flat + updates, opt_state, loss, g
        mine = flat if shard_params else lax.dynamic_slice_in_dim(flat, me * k, k)
        g_mine = g if shard_grads else lax.dynamic_slice_in_dim(g, me * k, k)
        updates, opt_state = optimizer.update(g_mine, opt_state, mine)
        new = mine + updates
        new_flat = new if shard_params else lax.all_gather(new, axis, tiled=True)
        return new_flat, opt_state, loss, g

    opt_template = jax.eval_shape(optimizer.init, jax.ShapeDtypeStruct((padded,), flat0.dtype))
    p_spec = P(axis) if shard_params else P()
    o_spec = _opt_specs(opt_template, axis) if shard_opt else jax.tree.map(lambda _: P(),
                                                                          opt_template)
    g_spec = P(axis) if shard_grads else P()
    # check_vma=False: the all-gathered new parameters are identical on every device, but JAX
    # types an all_gather result as varying, which a replicated out_spec would reject.
    body = jax.shard_map(local, mesh=mesh, in_specs=(p_spec, o_spec, P(axis), P(axis), P(axis)),
                         out_specs=(p_spec, o_spec, P(), g_spec), check_vma=False)
    step = jax.jit(body)

    def init(tree):
        leaves = [np.ravel(np.asarray(leaf)) for leaf in jax.tree.leaves(tree)]
        flat = np.pad(np.concatenate(leaves), (0, padded - psi))  # ravel_pytree's order
        opt = optimizer.init(flat)
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))
        return put(flat, p_spec), jax.tree.map(put, opt, o_spec)

    return ZeroStep(stage, step, init, lambda f: unravel(jnp.asarray(f)[:psi]), psi, padded)


def _ravel_abstract(params):
    """``ravel_pytree`` traced abstractly: the flat vector's shape and the (static) unravel."""
    box = {}

    def flat(p):
        out, box["unravel"] = ravel_pytree(p)
        return out
    return jax.eval_shape(flat, params), box["unravel"]


def per_device_bytes(stage: int, padded: int, n: int, itemsize: int,
                     opt_slots: int = 2) -> dict[str, int]:
    """The formulas (``stages.per_device_bytes``): bytes per device of params, grads and
    optimizer slots (Adam: m and v) of the flat vector, ``padded`` a multiple of ``n``."""
    full = padded * itemsize
    return stages.per_device_bytes(stage, full, full, opt_slots * full, n)


def measure(compiled) -> dict[str, int]:
    """Per-device argument, output and temp bytes of a compiled step (``memory_analysis()``)."""
    ma = compiled.memory_analysis()
    return {"arguments": int(ma.argument_size_in_bytes), "outputs": int(ma.output_size_in_bytes),
            "temp": int(ma.temp_size_in_bytes)}


def expected_bytes(stage: int, padded: int, n: int, itemsize: int, opt_state, batch_bytes: int,
                   loss_bytes: int, param_leaves: int = 1) -> dict[str, int]:
    """Arguments = params + optimizer state + batch/N; outputs = params + state + grads + loss.

    ``padded`` is Ψ (rounded up to a multiple of N for the flat ZeRO layout); ``param_leaves`` is
    how many arrays hold the params (1 for the flat layout). XLA returns the outputs as one tuple,
    whose index table adds 8 bytes (a pointer) per output array.
    """
    f = per_device_bytes(stage, padded, n, itemsize)
    leaves = jax.tree.leaves(opt_state)
    scalars = sum(np.dtype(a.dtype).itemsize for a in leaves if a.ndim == 0)
    state = f["params"] + f["optimizer"] + scalars
    tuple_table = 8 * (2 * param_leaves + len(leaves) + 1)  # params, grads, optimizer, loss
    return {"arguments": state + batch_bytes // n,
            "outputs": state + f["grads"] + loss_bytes + tuple_table,
            **f, "model_state": f["params"] + f["grads"] + f["optimizer"]}
