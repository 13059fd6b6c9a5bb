"""A plan's layout run for real, small: the same layout (mesh, ZeRO stage, recomputation,
parameter specs) applied by ``shard`` to a model that fits this machine — the model itself, or a
variant the user names (fewer layers, narrower) whose parameter paths the layout's rules match.

Two checks: ``shard``'s exactness verdict against one device, and the bytes of the training state
actually placed on every device (the addressable shards of the parameters and the optimizer
state) against the plan's own per-device figures for that model.
"""
from __future__ import annotations

from dataclasses import dataclass

import jax

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel.shard import inputs

MAX_DEVICES = 64


@dataclass
class Validation:
    """What running the layout small showed."""

    target: str
    mesh: dict
    exact: bool
    reason: str
    placed: dict | None     # "params", "optimizer": bytes on the fullest device, placed
    planned: dict | None    # the same by the plan's layout arithmetic
    devices_equal: bool | None  # every device holds the same bytes as the fullest

    @property
    def bytes_equal(self) -> bool | None:
        """Placed == planned (None: not measured, a pipeline's padded flat buffers)."""
        return None if self.placed is None else self.placed == self.planned

    def to_json(self) -> dict:
        return {"target": self.target, "mesh": self.mesh, "exact": self.exact,
                "reason": self.reason, "placed": self.placed, "planned": self.planned,
                "bytes_equal": self.bytes_equal, "devices_equal": self.devices_equal}


def _per_device(tree) -> dict:
    """Bytes of ``tree``'s addressable shards on each device."""
    out: dict = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            out[s.device] = out.get(s.device, 0) + s.data.nbytes
    return out


def placed_state(layout, trainable, optimizer) -> tuple[dict, bool]:
    """The parameters and optimizer state placed by ``layout``: bytes on the fullest device,
    and whether every device of the mesh holds as many."""
    params = jax.device_put(trainable, layout.params)
    state = jax.jit(optimizer.init, out_shardings=layout.opt_state)(params)
    by = {"params": _per_device(params), "optimizer": _per_device(state)}
    devices = list(layout.mesh.devices.flat)
    equal = all(len({v.get(d, 0) for d in devices}) == 1 for v in by.values())
    return {k: max(v.values(), default=0) for k, v in by.items()}, equal


def validate(layout_data: dict, loss_fn, params, batch, optimizer, *, target: str,
             steps: int = 1, progress=None) -> Validation:
    """Run ``layout_data`` (a layout file's object) on the factory's model through ``shard``."""
    from mlsys_jax.ir.abstract import is_abstract
    from mlsys_jax.parallel.shard import ShardOptions, simulate
    from mlsys_jax.parallel.shard.setup import prepare
    from mlsys_jax.planning import layout_file
    from mlsys_jax.planning.remat import with_remat

    mesh = dict(layout_data["mesh"])
    size = 1
    for v in mesh.values():
        size *= v
    if size > MAX_DEVICES:
        raise MlsysError(f"--validate: the layout uses {size} devices; this machine simulates "
                         f"at most {MAX_DEVICES}: plan for fewer devices to validate")
    if is_abstract((params, batch)):
        raise MlsysError(f"--validate {target}: the factory returns shapes, which cannot run; "
                         "name a small variant of the model that returns arrays "
                         "(--validate FN_SMALL)")
    rows = inputs.check_batch(batch, 1)
    if rows % mesh.get("data", 1):
        raise MlsysError(f"--validate {target}: its batch of {rows} rows does not split over "
                         f"data={mesh['data']}; give it a batch of a multiple of {mesh['data']}")
    if "pipeline" in layout_data:
        return _validate_pipeline(layout_data, loss_fn, params, batch, optimizer, target=target,
                                  steps=steps)
    loss_fn = with_remat(loss_fn, params, layout_data.get("remat"))
    rules = layout_file.tp_rules(layout_data)
    zero = layout_data["zero"]
    setup = prepare(loss_fn, params, batch, optimizer, mesh, zero, rules=rules)
    lay = setup.layout
    layout_file.check_held(layout_data, lay.kept_specs,
                           f"(the plan's layout, on {target})")
    placed, equal = placed_state(lay, setup.trainable, optimizer)
    planned = {"params": int(lay.held["params"]), "optimizer": int(lay.held["optimizer"])}
    report = simulate(loss_fn, params, batch, optimizer, mesh,
                      ShardOptions(zero=zero, steps=steps, progress=bool(progress),
                                   time_repeats=0), rules=rules)
    return Validation(target, mesh, bool(report.exact), report.reason, placed, planned, equal)


def _validate_pipeline(layout_data: dict, loss_fn, params, batch, optimizer, *, target: str,
                       steps: int) -> Validation:
    """A pipelined layout run by the pipeline path (``parallel/pipe``) at the layout's stages,
    microbatches, schedule and split: exactness only (its state lives in flat buffers padded to
    the largest stage, so placed bytes are not compared)."""
    from mlsys_jax.parallel.comm import QUICK_COMPILE
    from mlsys_jax.parallel.pipe import plan_pipeline, run_pipeline
    from mlsys_jax.planning.candidates import STAGE_REMAT

    pipe, mesh = layout_data["pipeline"], dict(layout_data["mesh"])
    plan = plan_pipeline(loss_fn, params, batch, optimizer, mesh, pipe["microbatches"],
                         schedule=pipe["schedule"], split=pipe.get("split"),
                         remat=layout_data.get("remat") == STAGE_REMAT)
    report = run_pipeline(plan, steps, options=QUICK_COMPILE, stage_memory=False)
    return Validation(target, mesh, bool(report.exact), report.reason, None, None, None)
