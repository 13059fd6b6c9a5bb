"""``plan``: how to split a user's step over N devices — every layout enumerated, pruned by an
estimate, the best ``shortlist`` compiled on N simulated devices, the fastest that fits chosen.

docs/plan.md has the model of memory and time, its assumptions and its measured figures.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import jax

from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.abstract import shapes_of
from mlsys_jax.parallel.axes import DATA, PIPE
from mlsys_jax.parallel.shard.inputs import with_rows
from mlsys_jax.planning.assess import OVERLAP, Assessed, estimate_memory, formula_rows, predict_time
from mlsys_jax.planning.candidates import enumerate_candidates
from mlsys_jax.planning.facts import Facts, gather_facts
from mlsys_jax.planning.links import LINKS, size
from mlsys_jax.planning.remat import with_remat
from mlsys_jax.progress import SILENT, Progress

SHORTLIST = 8
EXTRA_ROUNDS = 3
TIE = 0.01           # predicted step times within 1% are one time: the model is not finer


@dataclass
class PlanResult:
    """Every layout considered, the chosen one and the Pareto front of the compiled ones."""

    devices: int
    gpus_per_node: int
    hw: str
    memory_bytes: int
    global_batch: int
    assessed: list
    chosen: int | None
    pareto: list
    why: str
    facts: Facts = field(repr=False)
    seconds: float = 0.0

    def to_json(self) -> dict:
        """``plan --json``: the figures of every candidate, the chosen index, the front."""
        return {"devices": self.devices, "gpus_per_node": self.gpus_per_node, "hw": self.hw,
                "memory_bytes": self.memory_bytes, "global_batch": self.global_batch,
                "links": LINKS[self.hw].as_dict(), "overlap": OVERLAP,
                "candidates": [_candidate_json(a) for a in self.assessed],
                "chosen": self.chosen, "pareto": self.pareto, "why": self.why,
                "seconds": self.seconds}

    @property
    def best(self) -> Assessed | None:
        return None if self.chosen is None else self.assessed[self.chosen]

    def layout_data(self, index: int | None = None) -> dict:
        """The layout file's object (``planning.layout_file``) of candidate ``index`` (default:
        the chosen one)."""
        from mlsys_jax.planning import layout_file

        index = self.chosen if index is None else index
        if index is None:
            raise MlsysError("plan: no layout was chosen, so there is none to emit")
        c = self.assessed[index].candidate
        lay = self.facts.layout(c.data, c.model, c.zero)
        pipeline = ({"stages": c.pipe, "microbatches": c.microbatches, "schedule": c.schedule,
                     "split": self.assessed[index].split} if c.pipe > 1 else None)
        return layout_file.to_data(mesh=c.shard_mesh, zero=c.zero, remat=c.remat,
                                   param_specs=lay.kept_specs,
                                   pipeline=pipeline)


def _candidate_json(a: Assessed) -> dict:
    c = a.candidate
    return {"mesh": c.mesh, "zero": c.zero, "remat": c.remat, "microbatches": c.microbatches,
            "schedule": c.schedule, "fits": a.fits, "reason": a.reason, "compiled": a.compiled,
            "compile_s": a.compile_s, "estimate": a.estimate, "per_device": a.per_device,
            "predicted_step_s": a.predicted_step_s, "compute_s": a.compute_s,
            "comm_s": a.comm_s, "bubble": a.bubble, "mfu_bound": a.mfu_bound,
            "collectives": a.collectives, "split": a.split, "notes": a.notes}


def check_request(*, devices: int, gpus_per_node: int, hw: str, memory_bytes: int) -> None:
    """The request's own sense, before any model is built (one line each)."""
    if not isinstance(devices, int) or devices < 1:
        raise MlsysError(f"--devices must be a positive number of GPUs, got {devices!r}")
    if not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise MlsysError(f"--gpus-per-node must be positive, got {gpus_per_node!r}")
    if devices % gpus_per_node and devices > gpus_per_node:
        raise MlsysError(f"--devices {devices} is not a whole number of nodes of "
                         f"{gpus_per_node} GPUs (--gpus-per-node); use a multiple of "
                         f"{gpus_per_node}, or the node size you have")
    if hw not in LINKS:
        raise MlsysError(f"--hw {hw!r}: the plan knows {', '.join(LINKS)} (their compute and "
                         "links are published figures)")
    if memory_bytes <= 0:
        raise MlsysError(f"--memory must be positive, got {memory_bytes}")


def plan(loss_fn, params, batch, optimizer, rules=None, *, devices: int,
         gpus_per_node: int = 8, hw: str = "h100", memory_bytes: int = 80 * 10**9,
         global_batch: int | None = None, microbatches: int | None = None,
         shortlist: int = SHORTLIST, progress: Progress = SILENT) -> PlanResult:
    """Search the layouts of ``devices`` GPUs for the user's step ``(loss_fn, params, batch,
    optimizer[, rules])`` (arrays or ShapeDtypeStructs; only shapes are read). JAX must have at
    least ``devices`` devices (simulated CPU devices: ``--devices``)."""
    from mlsys_jax.cost.hardware import get_hardware
    from mlsys_jax.parallel.shard import collectives

    t0 = time.perf_counter()
    check_request(devices=devices, gpus_per_node=gpus_per_node, hw=hw, memory_bytes=memory_bytes)
    if len(jax.devices()) < devices:
        raise MlsysError(f"plan: {devices} devices asked for but JAX has {len(jax.devices())}; "
                         f"start with --devices {devices} (set before JAX starts)")
    node = min(gpus_per_node, devices)
    params, batch = shapes_of(params), shapes_of(batch)
    for flag, value in (("--shortlist", shortlist), ("--microbatches", microbatches)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise MlsysError(f"{flag} must be a positive number, got {value!r}")
    if global_batch is not None:
        if global_batch < 1:
            raise MlsysError(f"--global-batch must be positive, got {global_batch}")
        batch = with_rows(batch, global_batch)
    facts = gather_facts(loss_fn, params, batch, optimizer, rules, progress=progress)
    if memory_bytes * devices < facts.param_bytes:
        raise MlsysError(
            f"--memory {size(memory_bytes)} is less than the parameters alone split over all "
            f"{devices} devices ({size(facts.param_bytes / devices)} each of "
            f"{size(facts.param_bytes)}): no layout can fit; more devices or memory")
    hardware, links = get_hardware(hw), LINKS[hw]
    assessed = [Assessed(c, why) for c, why in enumerate_candidates(
        devices, gpus_per_node=node, global_batch=facts.global_batch, remats=facts.remats,
        microbatches=microbatches)]
    formulas = {}
    progress.stage(f"estimating {len(assessed)} layouts (state exact, activations estimated)")
    for k, a in enumerate(assessed):
        if a.reason:
            continue
        c = a.candidate
        key = (c.data, c.model, c.zero)
        if key not in formulas:
            progress.item(k + 1, len(assessed), f"laying out data={c.data} model={c.model} "
                          f"ZeRO-{c.zero}")
            formulas[key] = formula_rows(collectives.formulas(
                facts.loss, facts.trainable, facts.batch, facts.layout(*key)),
                len(jax.tree.leaves(facts.trainable)))
        estimate_memory(a, facts, facts.layout(*key))
        predict_time(a, facts, hw=hardware, links=links, gpus_per_node=node, devices=devices,
                     formula_rows=formulas[key])
        if a.estimate["total_bytes"] > memory_bytes:
            e = a.estimate
            a.reason = (f"does not fit: {size(e['total_bytes'])} > {size(memory_bytes)} (state "
                        f"{size(e['total_bytes'] - e['activation_bytes'])} + activations "
                        f"{size(e['activation_bytes'])}, estimated)")
    _compile_shortlist(assessed, facts, shortlist, memory_bytes=memory_bytes, hw=hardware,
                       links=links, node=node, devices=devices, formulas=formulas,
                       progress=progress)
    chosen, pareto, why = _choose(assessed)
    return PlanResult(devices, node, hw, memory_bytes, facts.global_batch, assessed, chosen,
                      pareto, why, facts, time.perf_counter() - t0)


def _compile_shortlist(assessed, facts, shortlist, *, memory_bytes, hw, links, node, devices,
                       formulas, progress) -> None:
    from mlsys_jax.parallel.shard.shapes import compile_on_shapes

    ranked = sorted((a for a in assessed if a.fits),
                    key=lambda a: (a.predicted_step_s, a.estimate["total_bytes"]))
    # a pipeline's estimate is the crudest (stages padded to the largest, sends not counted):
    # at most a quarter of the compiles go to pipelined layouts
    piped = [a for a in ranked if a.candidate.pipe > 1][:max(1, shortlist // 4)]
    ranked = [a for a in ranked if a.candidate.pipe == 1 or a in piped]
    # the best ``shortlist`` by the estimate; while none of them fits as compiled (the estimate
    # is optimistic), the next ones too, up to EXTRA_ROUNDS × shortlist in all
    for k, a in enumerate(ranked, 1):
        if k > shortlist and (any(b.compiled and b.fits for b in ranked[:k - 1])
                              or k > EXTRA_ROUNDS * shortlist):
            break
        c = a.candidate
        progress.stage(f"compiling layout {k} by the estimate on {devices} simulated devices: "
                       f"{c.label()}")
        t0 = time.perf_counter()
        if c.pipe > 1:
            try:
                a.per_device, a.collectives = _compile_pipeline(facts, a, hw.name)
            except MlsysError as e:          # the model cannot be cut so (too few units)
                a.reason = f"the pipeline cannot be built: {e}"
                continue
        else:
            specs, _ = facts.tp_specs(c.model)
            rules = [(_rx(p), s) for p, s in specs.items()] if c.model > 1 else None
            loss = with_remat(facts.loss_fn, facts.params, c.remat)
            report = compile_on_shapes(loss, facts.params, facts.batch, facts.optimizer,
                                       c.shard_mesh, zero=c.zero, rules=rules)
            a.per_device = report.per_device
            a.collectives = [{"kind": r["kind"], "axis": r["axis"], "count": r["count"],
                              "bytes": r["bytes"]} for r in report.collectives]
        a.compile_s, a.compiled = time.perf_counter() - t0, True
        predict_time(a, facts, hw=hw, links=links, gpus_per_node=node, devices=devices,
                     formula_rows=formulas[(c.data, c.model, c.zero)])
        if a.per_device["total_bytes"] > memory_bytes:
            a.reason = (f"does not fit as compiled: {size(a.per_device['total_bytes'])} > "
                        f"{size(memory_bytes)} (XLA: arguments + outputs − aliased + temp)")


def _compile_pipeline(facts: Facts, a: Assessed, hw: str) -> tuple[dict, list]:
    """The pipelined step (``parallel/pipe``) compiled on shapes: per-device bytes (XLA's, and
    the largest stage's parameters) and its collectives per step."""
    from mlsys_jax.parallel.pipe import plan_pipeline
    from mlsys_jax.parallel.shard.collectives import by_axis
    from mlsys_jax.parallel.shard.layout import state_and_xla_bytes
    from mlsys_jax.planning.candidates import STAGE_REMAT

    c = a.candidate
    shape = {DATA: c.data, PIPE: c.pipe} if c.data > 1 else {PIPE: c.pipe}
    plan = plan_pipeline(facts.loss_fn, facts.params, facts.batch, facts.optimizer, shape,
                         c.microbatches, schedule=c.schedule, remat=c.remat == STAGE_REMAT,
                         hw=hw)
    compiled = plan.compile()
    stage_params = max(plan.leaves.bytes_per_stage())
    per_device = state_and_xla_bytes(stage_params, stage_params, a.estimate["optimizer_bytes"],
                                     compiled)
    names = [u.name for u in plan.units.units]
    a.split = [names[k] for k in range(1, len(names))
               if plan.stage_of_unit[k] != plan.stage_of_unit[k - 1]]
    a.notes.append(f"stages start at {', '.join([names[0]] + a.split)} (units: "
                   f"{', '.join(names)}); optimizer bytes estimated; point-to-point sends "
                   "counted at every schedule step (each runs only when its boundary sends)")
    rows = by_axis(compiled.as_text(), plan.program.mesh)
    return per_device, [{"kind": k[0], "axis": k[1], "count": v["count"],
                         "bytes": v["ring_bytes"]} for k, v in rows.items()]


def _rx(path: str) -> str:
    import re

    return re.escape(path) + "$"


def _choose(assessed) -> tuple[int | None, list, str]:
    """The fastest compiled layout that fits (of those within ``TIE`` of the fastest, the
    smallest), the Pareto front of the compiled ones that fit, and why."""
    ok = [(i, a) for i, a in enumerate(assessed) if a.compiled and a.fits]
    if not ok:
        return None, [], "no compiled layout fits"
    front = []
    for i, a in sorted(ok, key=lambda t: (t[1].bytes, t[1].predicted_step_s)):
        if not front or a.predicted_step_s < assessed[front[-1]].predicted_step_s:
            front.append(i)
    fastest = min(a.predicted_step_s for _, a in ok)
    tied = [(i, a) for i, a in ok if a.predicted_step_s <= fastest * (1 + TIE)]
    best_i, best = min(tied, key=lambda t: (t[1].bytes, t[1].predicted_step_s))
    others = sorted((t for t in ok if t[0] != best_i), key=lambda t: t[1].predicted_step_s)
    if not others:
        return best_i, front, "the only compiled layout that fits"
    nxt = others[0][1]
    if len(tied) > 1:
        why = (f"of the {len(ok)} compiled layouts that fit, {len(tied)} are within "
               f"{TIE:.0%} of the least predicted step time ({fastest * 1e3:.4g} ms): the "
               f"smallest of them ({size(best.bytes)} per device)")
    else:
        why = (f"the least predicted step time of the {len(ok)} compiled layouts that fit: "
               f"{best.predicted_step_s * 1e3:.4g} ms against {nxt.predicted_step_s * 1e3:.4g} "
               f"ms for the next ({nxt.candidate.label()})")
    return best_i, front, why
