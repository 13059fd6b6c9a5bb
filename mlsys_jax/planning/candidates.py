"""The layouts a plan considers for N devices: one row of data each.

Every factorization of N into data × model × pipe, each ZeRO stage over the data axis
(``parallel/stages.py``; stage 0 is plain data parallelism), each recomputation the loss allows
(as the user wrote it, or a scanned model's body checkpointed under a policy:
``remat.planner.scan_bodies``), and for ``pipe`` > 1 (``parallel/pipe``: data × pipe, no ZeRO)
the microbatch counts, the schedules and recomputing each stage's forward. A layout
that breaks a rule of the hardware or of the batch is kept with its reason (it is printed among
the refusals), never silently dropped.
"""
from __future__ import annotations

from dataclasses import dataclass

from mlsys_jax.parallel.axes import DATA, FSDP, MODEL, PIPE
from mlsys_jax.parallel.stages import STAGE_NUMBERS

AS_WRITTEN = "as written"
SCHEDULES = ("1f1b", "gpipe")
MICROBATCH_FACTORS = (1, 2, 4)     # pipe > 1: microbatches = factor × stages
PIPE_STAGES = (1, 2, 4, 8)         # stage counts considered
PIPE_ZERO = (0,)                   # the pipeline path keeps whole state per stage (no ZeRO)
STAGE_REMAT = "stage"              # a pipeline's recomputation: each stage's forward again


@dataclass(frozen=True)
class Candidate:
    """One layout: the mesh, the ZeRO stage over data, the recomputation and the pipeline's
    microbatches and schedule (1 and None without a pipe axis)."""

    data: int
    model: int
    pipe: int
    zero: int
    remat: str = AS_WRITTEN
    microbatches: int = 1
    schedule: str | None = None

    @property
    def mesh(self) -> dict:
        """The mesh shape with the axes the step runs on (sizes 1 included for the JSON)."""
        return {DATA: self.data, FSDP: 1, MODEL: self.model, PIPE: self.pipe}

    @property
    def shard_mesh(self) -> dict:
        """The mesh ``shard`` builds for this layout (axes of size 1 left out, data kept)."""
        out = {DATA: self.data}
        if self.model > 1:
            out[MODEL] = self.model
        if self.pipe > 1:
            out[PIPE] = self.pipe
        return out

    def label(self) -> str:
        parts = [f"data={self.data}"]
        if self.model > 1:
            parts.append(f"model={self.model}")
        if self.pipe > 1:
            parts.append(f"pipe={self.pipe} ({self.schedule}, {self.microbatches} microbatches)")
        parts.append(f"ZeRO-{self.zero}")
        if self.remat != AS_WRITTEN:
            parts.append(f"remat {self.remat}")
        return " ".join(parts)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_candidates(devices: int, *, gpus_per_node: int, global_batch: int,
                         remats: tuple = (AS_WRITTEN,), microbatches: int | None = None
                         ) -> list[tuple[Candidate, str]]:
    """``(candidate, reason)`` for every layout of ``devices``; ``reason`` is empty for a layout
    that may run, else the one line that rules it out."""
    out = []
    for model in _divisors(devices):
        for pipe in (p for p in _divisors(devices // model) if p in PIPE_STAGES):
            data = devices // (model * pipe)
            why = _shape_reason(data, model, pipe, gpus_per_node, global_batch)
            for mb, schedule in _pipelines(pipe, global_batch // data if not why else 1,
                                           microbatches):
                for zero in (STAGE_NUMBERS if pipe == 1 else PIPE_ZERO):
                    for remat in (remats if pipe == 1 else (AS_WRITTEN, STAGE_REMAT)):
                        c = Candidate(data, model, pipe, zero, remat, mb, schedule)
                        out.append((c, why or _microbatch_reason(c, global_batch)))
    return out


def _shape_reason(data, model, pipe, gpus_per_node, global_batch) -> str:
    if pipe > 1 and model > 1:
        return "the pipeline path runs data × pipe meshes (no model axis inside a stage yet)"
    if model > gpus_per_node:
        return f"TP {model} crosses a node ({gpus_per_node} GPUs per node)"
    if gpus_per_node % model:
        return f"TP {model} does not divide a node of {gpus_per_node} GPUs"
    if global_batch % data:
        return f"the global batch {global_batch} does not split over data={data}"
    return ""


def _pipelines(pipe: int, rows: int, microbatches: int | None):
    if pipe == 1:
        yield 1, None
        return
    counts = (microbatches,) if microbatches else tuple(f * pipe for f in MICROBATCH_FACTORS)
    for m in counts:
        for schedule in SCHEDULES:
            yield m, schedule


def _microbatch_reason(c: Candidate, global_batch: int) -> str:
    rows = global_batch // c.data
    if c.pipe > 1 and rows % c.microbatches:
        return (f"{rows} rows per data shard do not split into {c.microbatches} microbatches")
    return ""
