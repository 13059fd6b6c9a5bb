"""What a plan needs to know of a user's step before it looks at any layout, each figure computed
once: the tensor-parallel split for each model-axis size, the activation bytes of one device's
microbatch under each recomputation, the step's compute time at the roofline and its FLOPs.

The activation estimate is XLA's own: the gradient compiled on one device at one and at two rows
of the batch (temp bytes; the program's own liveness, fusion and buffer reuse), extended linearly
to a layout's rows per microbatch, and divided by the model axis (an optimistic split: the
per-head and per-feature activations divide, the LayerNorm inputs do not; the compiled shortlist
is the referee). The compute time is the project's per-kernel roofline model, fused, of the whole
step on one device at the global batch, divided over the devices.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.differentiable import check_grad_traces
from mlsys_jax.parallel.axes import MODEL
from mlsys_jax.parallel.mesh import make_mesh
from mlsys_jax.parallel.shard import inputs, model_split, sync
from mlsys_jax.parallel.shard.partition_rules import array_paths
from mlsys_jax.planning.candidates import AS_WRITTEN, STAGE_REMAT
from mlsys_jax.progress import SILENT, Progress

EXTRA_SPLIT_SHARE = 0.01     # a leaf the Megatron split leaves whole is split over model when it
#                              holds at least this share of the parameters (an embedding, a head)


@dataclass
class Facts:
    """A user's step, traced once, and the figures every layout shares."""

    loss_fn: object
    params: object
    batch: object
    optimizer: object
    rules: object
    trainable: object
    loss: object                  # loss(trainable, batch): the user's loss on the float leaves
    closed: object                # the loss traced on (trainable, batch)
    global_batch: int
    n_params: int
    param_bytes: int
    dtype: str                    # the parameters' widest float dtype, as the cost model names it
    remats: tuple                 # AS_WRITTEN, and the scan-body policies where the loss has scans
    progress: Progress = SILENT
    _splits: dict = field(default_factory=dict)
    _layouts: dict = field(default_factory=dict)
    _act: dict = field(default_factory=dict)
    _flops: dict = field(default_factory=dict)
    _compute: dict = field(default_factory=dict)

    # ---- tensor parallelism -------------------------------------------------------------------
    def tp_specs(self, model: int) -> tuple[dict, dict]:
        """``(specs, why)`` for a model axis of ``model``: path -> PartitionSpec for every
        parameter (the user's rules or annotations, else Megatron's split from the dataflow,
        then large leaves left whole split by their largest dimension that ``model`` divides:
        a vocab-parallel embedding or head where the vocabulary divides); ``why``: path -> the
        reason a large leaf stays whole, or how it was split."""
        if model in self._splits:
            return self._splits[model]
        mesh = make_mesh({MODEL: model})
        split = model_split.decide(self.params, self.trainable, self.closed, self.rules, None,
                                   mesh)
        specs, notes = dict(split.specs), {}
        total = max(self.n_params, 1)
        for path, leaf in array_paths(self.trainable):
            spec = specs.get(path, P())
            if model == 1 or any(e is not None for e in spec) or \
                    math.prod(leaf.shape) < EXTRA_SPLIT_SHARE * total:
                continue
            dims = sorted(range(len(leaf.shape)), key=lambda d: -leaf.shape[d])
            d = next((d for d in dims if leaf.shape[d] % model == 0), None)
            if d is None:
                notes[path] = f"whole: no dimension of {tuple(leaf.shape)} divides by {model}"
                continue
            entries = [None] * len(leaf.shape)
            entries[d] = MODEL
            specs[path] = P(*entries)
            notes[path] = (f"split by its largest dimension ({leaf.shape[d]}) over model"
                           if d == dims[0] else
                           f"split by dimension {d} ({leaf.shape[d]}): its largest "
                           f"({leaf.shape[dims[0]]}) does not divide by {model}")
        self._splits[model] = (specs, notes)
        return self._splits[model]

    def layout(self, data: int, model: int, zero: int):
        """``shard``'s layout (``parallel/shard/layout.make_layout``) of the step on a data ×
        model mesh at ZeRO stage ``zero``: what each device holds, exactly."""
        from mlsys_jax.parallel.axes import DATA
        from mlsys_jax.parallel.shard.layout import make_layout

        key = (data, model, zero)
        if key not in self._layouts:
            specs, _ = self.tp_specs(model)
            mesh = make_mesh({DATA: data, MODEL: model} if model > 1 else {DATA: data})
            self._layouts[key] = make_layout(self.trainable, self.optimizer, self.batch, mesh,
                                             zero, specs)
        return self._layouts[key]

    # ---- activations, FLOPs and compute time --------------------------------------------------
    def loss_for(self, remat: str):
        """The loss as the layout runs it: the user's, or its scan bodies checkpointed (a
        pipeline's stage recomputation is the pipeline's own: the user's loss here)."""
        if remat in (AS_WRITTEN, STAGE_REMAT):
            return self.loss
        from mlsys_jax.remat.planner.scan_bodies import with_bodies_checkpointed

        return with_bodies_checkpointed(self.loss, remat)

    def _one_device(self, remat: str, rows: int) -> tuple[int, float]:
        """(XLA temp bytes, XLA FLOPs with scans per trip) of one device's gradient at ``rows``."""
        remat = AS_WRITTEN if remat == STAGE_REMAT else remat
        key = (remat, rows)
        if key not in self._act:
            from mlsys_jax.cost.xla import xla_flops_per_trip

            self.progress.stage(f"compiling one device's gradient at {rows} row(s), remat "
                                f"{remat}: activation bytes")
            loss = self.loss_for(remat)
            args = (self.trainable, inputs.with_rows(self.batch, rows))
            traced = jax.jit(jax.grad(loss)).trace(*args)
            compiled = traced.lower().compile()
            flops = float((compiled.cost_analysis() or {}).get("flops", 0.0))
            flops = xla_flops_per_trip(traced.jaxpr, flops)
            self._act[key] = (int(compiled.memory_analysis().temp_size_in_bytes), flops)
        return self._act[key]

    def activation_bytes(self, remat: str, rows: int) -> float:
        """Temp bytes of one device's gradient at ``rows`` (linear in rows from 1 and 2)."""
        one = self._one_device(remat, 1)[0]
        if rows == 1 or self.global_batch < 2:
            return float(one)
        two = self._one_device(remat, 2)[0]
        return float(one + max(two - one, 0) * (rows - 1))

    def flops_ratio(self, remat: str) -> float:
        """The step's FLOPs under ``remat`` over as written (recomputation's cost); a pipeline
        stage's forward run again: 4/3 (a forward is a third of forward + backward)."""
        if remat == AS_WRITTEN:
            return 1.0
        if remat == STAGE_REMAT:
            return 4.0 / 3.0
        return self._one_device(remat, 1)[1] / max(self._one_device(AS_WRITTEN, 1)[1], 1.0)

    def step_compute(self, hw) -> dict:
        """The whole step on one device at the global batch, by the per-kernel roofline model
        (fused): ``{"seconds", "flops", "model_flops"}``; ``model_flops`` is 3× the forward's
        (the usual convention for MFU: recomputation not counted)."""
        from mlsys_jax.cost import estimate

        if hw.name not in self._compute:
            self.progress.stage(f"costing the step at the {hw.name} roofline (per kernel, fused)")
            step = jax.make_jaxpr(jax.grad(self.loss))(self.trainable, self.batch)
            report = estimate(step, hw=hw, fused=True)
            forward = estimate(self.closed, hw=hw, fused=True)
            self._compute[hw.name] = {"seconds": report.time_us * 1e-6,
                                      "flops": float(report.total_flops),
                                      "model_flops": 3.0 * float(forward.total_flops)}
        return self._compute[hw.name]


def gather_facts(loss_fn, params, batch, optimizer, rules=None, *,
                 progress: Progress = SILENT) -> Facts:
    """Trace the user's step once; the checks ``shard`` makes of a factory, made here first."""
    from mlsys_jax.cost.model import dtype_name
    from mlsys_jax.remat.planner.scan_bodies import POLICIES, scans_to_checkpoint

    inputs.check_step(loss_fn, optimizer)
    trainable, rest = inputs.split_params(params)
    leaves = jax.tree.leaves(trainable)
    if not leaves:
        raise MlsysError(f"params: no float arrays to train in {type(params).__name__}; the "
                         "factory's 2nd item must hold the parameters")
    rows = inputs.check_batch(batch, 1)

    def loss(t, b):
        return loss_fn(inputs.combine(t, rest), b)

    progress.stage("tracing the loss")
    closed, _ = sync.trace_binding(loss, trainable, batch, None)
    check_grad_traces(loss, (trainable, batch), what="loss_fn", closed=closed)
    remats = (AS_WRITTEN,) + (POLICIES if scans_to_checkpoint(closed.jaxpr) else ())
    widest = max((x.dtype for x in leaves), key=lambda d: jnp.finfo(d).bits)
    return Facts(loss_fn, params, batch, optimizer, rules, trainable, loss, closed, rows,
                 sum(math.prod(x.shape) for x in leaves),
                 sum(math.prod(x.shape) * x.dtype.itemsize for x in leaves),
                 dtype_name(widest), remats, progress)
