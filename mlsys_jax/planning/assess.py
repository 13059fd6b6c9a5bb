"""One layout judged: its per-device bytes (estimated, then compiled) and its step time as a
stated bound.

Memory, estimated: the state one device holds is exact (``parallel/shard/layout.make_layout``:
the ZeRO stage's row, the tensor-parallel specs), the activations are ``Facts``'s estimate for
one microbatch. Compiled: XLA's ``memory_analysis`` of the sharded step on the simulated mesh
(``parallel/shard/shapes.compile_on_shapes``): arguments + outputs − aliased + temp.

Time, a bound under stated assumptions: compute is the per-kernel roofline of the whole step
divided over the devices (× the FLOPs recomputation adds); communication is the α–β time of
each collective over its link — the compiled HLO's collectives (count and ring bytes per step)
when compiled, the layout's formulas otherwise — with no overlap of compute and communication
(the bound is their sum); a pipeline adds its bubble, (p − 1)/(m + p − 1) of the step.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mlsys_jax.parallel.axes import DATA, MODEL, PIPE
from mlsys_jax.parallel.shard.layout import shard_bytes
from mlsys_jax.planning.candidates import STAGE_REMAT, Candidate
from mlsys_jax.planning.links import collective_seconds, crosses_nodes

OVERLAP = "none: compute and communication add (an upper bound of the model)"


@dataclass
class Assessed:
    """A candidate with its figures; ``reason`` is empty while it may be chosen."""

    candidate: Candidate
    reason: str = ""
    estimate: dict = field(default_factory=dict)     # state and activation bytes, estimated
    per_device: dict = field(default_factory=dict)   # compiled: shard's per_device keys
    collectives: list = field(default_factory=list)  # compiled: kind, axis, count, bytes
    compiled: bool = False
    compile_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    bubble: float = 0.0
    predicted_step_s: float | None = None
    mfu_bound: float | None = None
    split: list | None = None      # pipelined: the units that start stages 2..p
    notes: list = field(default_factory=list)

    @property
    def bytes(self) -> float:
        """Per-device bytes: compiled when compiled, else estimated."""
        if self.compiled:
            return float(self.per_device["total_bytes"])
        return float(self.estimate.get("total_bytes", float("nan")))

    @property
    def fits(self) -> bool:
        return not self.reason


def estimate_memory(a: Assessed, facts, layout) -> None:
    """Fill ``a.estimate`` from ``layout`` (made for the candidate's data × model mesh)."""
    c = a.candidate
    held = layout.held
    state = held["params"] + held["grads"] + held["optimizer"]
    rows = facts.global_batch // c.data // c.microbatches
    act = facts.activation_bytes(c.remat, rows) / c.model
    # the step (parallel/shard/step.make_step) reduces the gradients over data in full before
    # keeping ZeRO-2/3's part, and ZeRO-3 gathers the parameters once for the forward: both
    # are working buffers of the TP share's size
    full = shard_bytes(facts.trainable, layout.compute)
    act += full * ((c.zero >= 2) + (c.zero == 3))
    if c.pipe > 1:     # a stage holds 1/p of the layers, and the microbatches in flight
        state /= c.pipe
        in_flight = c.pipe if c.schedule == "1f1b" else c.microbatches
        # recomputing, a stage holds one microbatch's activations at a time (and the inputs
        # of those in flight, not counted); otherwise every microbatch in flight
        act = act / c.pipe if c.remat == STAGE_REMAT else act * in_flight / c.pipe
    a.estimate = {"param_bytes": held["params"] / c.pipe, "grad_bytes": held["grads"] / c.pipe,
                  "optimizer_bytes": held["optimizer"] / c.pipe, "batch_bytes": held["batch"],
                  "activation_bytes": act,
                  "total_bytes": state + held["batch"] + act}


def _axis_links(axis: str, mesh: dict, gpus_per_node: int) -> tuple[int, bool]:
    """(group size, crosses nodes) of a collective's axis (``data``, ``model`` or both)."""
    names = [n for n in axis.replace("+", ",").split(",") if n in mesh]
    n = 1
    for name in names:
        n *= int(mesh[name])
    return n, any(crosses_nodes(mesh, name, gpus_per_node) for name in names)


def comm_seconds(rows: list, mesh: dict, *, gpus_per_node: int, links) -> float:
    """α–β seconds of collectives ``rows`` ({kind, axis, count, bytes}) on ``mesh``."""
    total = 0.0
    for r in rows:
        n, inter = _axis_links(r["axis"], mesh, gpus_per_node)
        if n > 1 and r["bytes"]:
            total += collective_seconds(r["kind"], r["bytes"], max(int(r["count"]), 1), n,
                                        inter=inter, links=links)
    return total


def predict_time(a: Assessed, facts, *, hw, links, gpus_per_node: int, devices: int,
                 formula_rows: list) -> None:
    """Fill the step-time bound and the MFU bound of ``a``."""
    c = a.candidate
    compute = facts.step_compute(hw)
    a.compute_s = compute["seconds"] / devices * facts.flops_ratio(c.remat)
    rows = a.collectives if a.compiled else formula_rows
    mesh = {DATA: c.data, MODEL: c.model, PIPE: c.pipe}
    a.comm_s = comm_seconds(rows, mesh, gpus_per_node=gpus_per_node, links=links)
    a.bubble = (c.pipe - 1) / (c.microbatches + c.pipe - 1) if c.pipe > 1 else 0.0
    a.predicted_step_s = (a.compute_s + a.comm_s) / (1.0 - a.bubble)
    peak = hw.peak(facts.dtype)
    a.mfu_bound = compute["model_flops"] / (devices * peak * a.predicted_step_s)


def formula_rows(formulas: dict, n_leaves: int) -> list:
    """The layout's collective formulas as rows like the compiled ones. Counts, for the α term:
    Megatron's all-reduces twice the forward's (the backward mirrors them), a ZeRO all-gather
    per parameter leaf, one gradient all-reduce (XLA combines them)."""
    counts = {"all-gather": n_leaves, "reduce-scatter": n_leaves}
    rows = []
    for k, v in formulas.items():
        if not isinstance(k, tuple) or not v[0]:
            continue
        count = (2 * max(formulas.get("forward_all_reduces", 1), 1) if k[1] == MODEL
                 else counts.get(k[0], 1))
        rows.append({"kind": k[0], "axis": k[1], "count": count, "bytes": v[0]})
    return rows
