"""Where a user's training state lives on a (data, model) mesh: DP, ZeRO 1-3 and TP as shardings.

§5 and §7.3 as ``NamedSharding`` trees for ``jax.jit`` (XLA inserts the collectives, and optax
runs on global arrays, so a global-norm clip stays global). The batch is split over ``data``;
tensor-parallel specs come from partition rules (``partition_rules.py``) over ``model``. ZeRO
then shards over ``data`` what its stage's row in ``parallel/stages.py`` says: stage 1 the
optimizer state, stage 2 also the gradients, stage 3 also the parameters. A leaf's ZeRO shard
is its TP spec with ``data`` added on the first dimension that is not split yet and that the
data size divides; a leaf with no such dimension (a bias of 10 on 4 devices) stays replicated
over ``data``, and :attr:`Layout.unsplit` lists it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from mlsys_jax.compat import Literal, dce_jaxpr_consts
from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import stages
from mlsys_jax.parallel.axes import DATA
from mlsys_jax.parallel.shard.partition_rules import array_paths
from mlsys_jax.parallel.stages import STAGE_NUMBERS, ZeroStage


@dataclass(frozen=True)
class Layout:
    """Shardings of every piece of a training step's state for one ZeRO stage and TP layout."""

    mesh: Mesh
    stage: int
    data_axis: str
    tp: dict             # keystr path -> TP PartitionSpec
    zero: dict           # keystr path -> TP spec with the data axis added (where it fits)
    unsplit: tuple       # paths ZeRO leaves replicated over data (no dimension it divides)
    compute: object      # params as the forward pass uses them (TP only)
    params: object       # params as the step keeps them (stage 3: ZeRO-sharded)
    grads: object        # gradients as the step returns them (stage >= 2: ZeRO-sharded)
    opt_state: object    # optimizer state (stage >= 1: ZeRO-sharded)
    batch: object        # the batch, split over data on its leading axis
    opt_shapes: object   # ShapeDtypeStructs of the optimizer state
    held: dict           # bytes one device holds: params, grads, optimizer, batch
    formula: dict        # the same by ZeRO's formula (§7.3)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())

    @property
    def splits(self) -> ZeroStage:
        """What this layout's ZeRO stage splits over the data axis (``parallel/stages.py``)."""
        return stages.zero_stage(self.stage)

    @property
    def kept_specs(self) -> dict:
        """keystr path -> the spec each parameter is kept in between steps (``params``'s)."""
        return self.zero if self.splits.params else self.tp

    @property
    def data_size(self) -> int:
        return int(self.mesh.shape[self.data_axis]) if self.data_axis in self.mesh.axis_names else 1


def _add_data_axis(spec: P, shape: tuple, mesh: Mesh, axis: str) -> P | None:
    """``spec`` with ``axis`` added where it divides: the first dimension not split yet, else a
    split one (model-major: ``('model', 'data')``); None if no dimension can take it."""
    n = int(mesh.shape[axis])
    entries = list(spec) + [None] * (len(shape) - len(spec))
    for d, (size, entry) in enumerate(zip(shape, entries)):
        if entry is None and size % n == 0 and size >= n:
            entries[d] = axis
            return P(*entries)
    for d, (size, entry) in enumerate(zip(shape, entries)):
        if entry is None:
            continue
        axes = (entry,) if isinstance(entry, str) else tuple(entry)
        if size % (n * math.prod(int(mesh.shape[a]) for a in axes)) == 0:
            entries[d] = axes + (axis,)
            return P(*entries)
    return None


def make_layout(trainable, optimizer: optax.GradientTransformation, batch, mesh: Mesh,
                stage: int, tp_specs: dict | None = None, data_axis: str = DATA) -> Layout:
    """Shardings for ``trainable`` (its array leaves), its optimizer state and ``batch``."""
    if stage not in STAGE_NUMBERS:
        raise MlsysError(f"--zero must be one of {', '.join(map(str, STAGE_NUMBERS))} (0 = plain "
                         f"data parallel), got {stage!r}")
    splits = stages.zero_stage(stage)
    n = int(mesh.shape[data_axis]) if data_axis in mesh.axis_names else 1
    tp_specs = dict(tp_specs or {})
    zero, unsplit = {}, []
    for path, leaf in array_paths(trainable):
        tp = tp_specs.setdefault(path, P())
        z = _add_data_axis(tp, tuple(leaf.shape), mesh, data_axis) if n > 1 else tp
        if z is None:
            unsplit.append(path)
        zero[path] = tp if z is None else z
    named = lambda spec: NamedSharding(mesh, spec)
    by_path = lambda table: jax.tree_util.tree_map_with_path(
        lambda p, _: named(table[jax.tree_util.keystr(p)]), trainable)
    tp_tree, zero_tree = by_path(tp_specs), by_path(zero)
    opt_shapes = jax.eval_shape(optimizer.init, trainable)

    def other_state(leaf):  # optimizer leaves that do not mirror a parameter: split by shape
        spec = (_add_data_axis(P(), tuple(leaf.shape), mesh, data_axis)
                if splits.optimizer and n > 1 else None)
        return named(spec or P())

    # state mirroring a parameter (Adam's m and v) is laid out like it; any other state (a step
    # count, Adafactor's factored rows) is split by its own shape
    opt = optax.tree_map_params(
        optimizer, lambda x, s, p: s if x.shape == p.shape else other_state(x), opt_shapes,
        zero_tree if splits.optimizer else tp_tree, trainable, transform_non_params=other_state)
    batch_tree = jax.tree.map(lambda _: named(P(data_axis) if n > 1 else P()), batch)
    params_tree, grads_tree = (zero_tree if splits.params else tp_tree,
                               zero_tree if splits.grads else tp_tree)
    held = {"params": shard_bytes(trainable, params_tree),
            "grads": shard_bytes(trainable, grads_tree),
            "optimizer": shard_bytes(opt_shapes, opt),
            "batch": shard_bytes(batch, batch_tree)}
    formula = _zero_formula(optimizer, trainable, opt_shapes, tp_tree, n, stage)
    return Layout(mesh, stage, data_axis, tp_specs, zero, tuple(unsplit), tp_tree, params_tree,
                  grads_tree, opt, batch_tree, opt_shapes, held, {**formula, "batch": held["batch"]})


def shard_bytes(shapes, shardings) -> int:
    """Bytes one device holds of a pytree of arrays (or ShapeDtypeStructs) laid out by ``shardings``."""
    leaves, shard = jax.tree.leaves(shapes), jax.tree.leaves(shardings)
    if len(leaves) != len(shard):
        raise ValueError(f"{len(leaves)} arrays but {len(shard)} shardings")
    return int(sum(_bytes_of(x, s) for x, s in zip(leaves, shard)))


def _bytes_of(x, sharding) -> int:
    return int(x.dtype.itemsize * math.prod(sharding.shard_shape(tuple(x.shape))))


def _zero_formula(optimizer, trainable, opt_shapes, tp_tree, n: int, stage: int) -> dict:
    """ZeRO's per-device bytes (§7.3, ``stages.per_device_bytes``) for this model, with the TP
    split applied first.

    The unsharded parts are Ψ (the parameters' bytes per device under TP) for the parameters and
    the gradients, and the optimizer's copies of the parameters (Adam: m and v); state that
    mirrors no parameter (Adam's step count) stays whole. The layout differs from this only by
    the leaves ZeRO could not split.
    """
    psi = shard_bytes(trainable, tp_tree)
    whole = lambda x: x.dtype.itemsize * math.prod(x.shape)
    mirrors = lambda x, p: x.shape == p.shape
    mirrored = sum(jax.tree.leaves(optax.tree_map_params(
        optimizer, lambda x, s, p: _bytes_of(x, s) if mirrors(x, p) else 0, opt_shapes, tp_tree,
        trainable, transform_non_params=lambda x: 0)))
    other = sum(jax.tree.leaves(optax.tree_map_params(
        optimizer, lambda x, s, p: 0 if mirrors(x, p) else whole(x), opt_shapes, tp_tree,
        trainable, transform_non_params=whole)))
    return stages.per_device_bytes(stage, psi, psi, mirrored, n, optimizer_whole=other)


def memory_report(layout: Layout, compiled, step_jaxpr) -> dict:
    """``memory_analysis()`` per device beside what the layout holds and ZeRO's formula.

    The expected arguments are the step's inputs (params, optimizer state, batch shard) and its
    outputs (params, optimizer state, loss, gradients), as XLA's program has them: ``jax.jit``
    returns an input the step passes through unchanged without handing it to XLA (Adafactor's
    placeholder state) and drops inputs nothing uses. XLA returns the outputs as one tuple whose
    index table holds a pointer (8 B) per array. ``step_jaxpr`` is the step's ClosedJaxpr.
    """
    jaxpr = step_jaxpr.jaxpr
    inputs = set(jaxpr.invars)
    forwarded = [not isinstance(v, Literal) and v in inputs for v in jaxpr.outvars]
    _, _, used = dce_jaxpr_consts(jaxpr, [not f for f in forwarded])
    leaves = jax.tree.leaves
    in_sh = leaves(layout.params) + leaves(layout.opt_state) + leaves(layout.batch)
    out_sh = (leaves(layout.params) + leaves(layout.opt_state) + [layout.replicated]
              + leaves(layout.grads))
    args = sum(_bytes_of(v.aval, s) for v, s, u in zip(jaxpr.invars, in_sh, used) if u)
    outs = sum(_bytes_of(v.aval, s) for v, s, f in zip(jaxpr.outvars, out_sh, forwarded) if not f)
    ma = compiled.memory_analysis()
    return {"measured": {"arguments": int(ma.argument_size_in_bytes),
                         "outputs": int(ma.output_size_in_bytes),
                         "temp": int(ma.temp_size_in_bytes)},
            "layout": dict(layout.held),
            "formula": {k: float(v) for k, v in layout.formula.items()},
            "expected": {"arguments": args, "outputs": outs + 8 * forwarded.count(False)}}


def per_device(layout: Layout, compiled) -> dict:
    """What the largest device holds: the layout's parameter, gradient and optimizer bytes, and
    XLA's ``memory_analysis`` of the compiled step (per device for an SPMD program) with their
    sum, ``total_bytes`` = arguments + outputs - aliased (outputs written into donated inputs)
    + temp."""
    return state_and_xla_bytes(layout.held["params"], layout.held["grads"],
                               layout.held["optimizer"], compiled)


def state_and_xla_bytes(params, grads, optimizer, compiled) -> dict:
    """``per_device``'s keys from the state's bytes one device holds and a compiled step."""
    ma = compiled.memory_analysis()
    xla = {"xla_argument_bytes": int(ma.argument_size_in_bytes),
           "xla_output_bytes": int(ma.output_size_in_bytes),
           "xla_temp_bytes": int(ma.temp_size_in_bytes),
           "xla_alias_bytes": int(ma.alias_size_in_bytes)}
    total = (xla["xla_argument_bytes"] + xla["xla_output_bytes"] - xla["xla_alias_bytes"]
             + xla["xla_temp_bytes"])
    return {"param_bytes": int(params), "grad_bytes": int(grads),
            "optimizer_bytes": int(optimizer), **xla, "total_bytes": total}
