"""``mlsys-jax shard`` on shapes: a user's step laid out and compiled for the mesh, not run.

At the size people train (an 8B model, 64 devices) nothing of the model can be allocated here,
and the questions are what each device holds and what the step sends. The layout is derived
exactly as for a concrete model (``setup.prepare``: annotations, axis rules, the dataflow's
Megatron split, the ZeRO stage's table row); the step — the user's loss, its gradient and the
optax update, with the state donated as a training loop does — is lowered on
``ShapeDtypeStruct``\\ s and compiled for the simulated mesh. Its figures are XLA's own
(``memory_analysis`` per device, the collectives in the compiled HLO, each counted once per
trip of the loops around it) beside the layout's bytes. Nothing runs, so there is no exactness
verdict: the report says "shapes only, not executed".
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from mlsys_jax.parallel import comm
from mlsys_jax.parallel.shard import collectives, report, step
from mlsys_jax.parallel.shard.inputs import display_path
from mlsys_jax.parallel.shard.layout import per_device
from mlsys_jax.parallel.shard.setup import prepare


@dataclass
class ShapesReport:
    """The figures of a step compiled on shapes: the JSON object is :meth:`to_json`."""

    mesh: dict
    zero: int
    per_device: dict           # the largest device: layout bytes and XLA's (see layout.per_device)
    collectives: list          # rows by (kind, axis): count and ring bytes per step, formulas
    compile_s: float
    tensor_parallel: dict = field(default_factory=dict)
    forward_all_reduces: dict = field(default_factory=dict)
    rules: list = field(default_factory=list)
    rules_derived: bool = False
    zero_unsplit: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    abstract: bool = True

    def to_json(self) -> dict:
        return {**asdict(self), "executed": False}


def compile_on_shapes(loss_fn: Callable, params, batch, optimizer, mesh_shape: dict, *,
                      zero: int = 0, rules=None, axis_rules=None, axis_names: dict | None = None,
                      options: dict | None = None, progress=None) -> ShapesReport:
    """Lay out and compile ``loss_fn``'s training step on ``mesh_shape`` from shapes alone.

    ``params`` and ``batch`` may hold ``jax.ShapeDtypeStruct`` leaves (or arrays: only their
    shapes are read). ``progress`` is called with a line per phase.
    """
    say = progress or (lambda _text: None)
    setup = prepare(loss_fn, params, batch, optimizer, mesh_shape, zero, rules=rules,
                    axis_rules=axis_rules, axis_names=axis_names)
    lay = setup.layout
    say(f"laid out the state; compiling the step for {lay.mesh.devices.size} simulated devices")
    t0 = time.perf_counter()
    compiled = step.compile_sharded(setup, setup.loss, options, donate=True)
    compile_s = time.perf_counter() - t0
    say("reading the compiled step's bytes and collectives")
    hlo = compiled.as_text()
    formulas = collectives.formulas(setup.loss, setup.trainable, setup.batch, lay)
    split = setup.split
    out = ShapesReport(
        mesh=dict(lay.mesh.shape), zero=lay.stage, per_device=per_device(lay, compiled),
        collectives=collectives.table(lay, hlo, formulas),
        compile_s=compile_s,
        tensor_parallel=report.tensor_parallel(split, int(lay.mesh.shape.get("model", 1))),
        rules=[list(r) for r in split.rules], rules_derived=split.source == "derived",
        zero_unsplit=[display_path(p) for p in lay.unsplit] if lay.stage else [])
    if "forward_all_reduces" in formulas:
        megatron = (split.megatron if split.source == "derived"
                    else formulas["forward_all_reduces"])
        out.forward_all_reduces, _ = collectives.forward_all_reduces(
            setup.loss, setup.trainable, setup.batch, lay, megatron, options)
    if any(not c.trips_known for c in comm.collectives(hlo)):
        out.notes.append("a collective sits in a while loop whose trip count XLA does not know: "
                         "it is counted once per step")
    out.notes.append("shapes only, not executed: XLA's figures for the compiled step; temp bytes "
                     "are XLA:CPU's (another backend fuses and schedules otherwise), argument and "
                     "output bytes depend only on the layout")
    return out
