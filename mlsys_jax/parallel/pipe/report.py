"""Run a planned pipeline for S steps and report every figure: :func:`run_pipeline`.

Teacher-forced steps decide *exact* (``verdict.py``; a loss that draws random numbers is judged
against the same bits, or with dropout off, or not claimed exact: ``stochastic.py``);
free-running steps show the drift after S steps; the last step's executed log, send counters
and compiled program give the figures (``figures.py``). Long work (compiles, steps) prints
progress on stderr.
"""
from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field

import jax

from mlsys_jax.parallel.pipe import figures, one_device
from mlsys_jax.parallel.shard.inputs import check_finite_loss
from mlsys_jax.parallel.pipe.balance import ranges_of
from mlsys_jax.parallel.pipe.step import PipelinePlan
from mlsys_jax.parallel.pipe.stochastic import OFF_FLAG, draws_random
from mlsys_jax.ir.precision import gradient_dtypes
from mlsys_jax.parallel.pipe.verdict import (NOISE_MARGIN, QUANTITIES, Float64Twin,
                                             NarrowLeaves, PipelineVerdict, causes, judge_step,
                                             leaf_diffs)


@dataclass
class PipelineReport:
    """Every figure of ``mlsys-jax shard --mesh [data=D,]pipe=P``; JSON via :meth:`to_json`."""

    mesh: dict
    schedule: str
    microbatches: int
    remat: bool
    steps: int
    exact: bool
    reason: str
    separable: bool
    teacher_forced: dict
    optimizer_check: dict
    max_abs_diff: dict
    units: list
    unit_source: str
    split_given: bool
    stages: list
    balance: dict
    bubble: dict
    in_flight: dict
    p2p: dict
    memory: dict
    stacked: dict | None
    replica_spread: float
    timeline: list = field(repr=False, default_factory=list)
    notes: list = field(default_factory=list)
    stochastic: dict | None = None   # the loss draws random numbers: how it was compared

    def to_json(self) -> dict:
        """The report as JSON data; bubble fractions as exact text and as floats."""
        out = asdict(self)
        for k in ("executed", "table", "formula"):
            frac = self.bubble[k]
            out["bubble"][k] = {"fraction": f"{frac.numerator}/{frac.denominator}",
                                "value": float(frac)}
        return out


def _progress(msg: str) -> None:
    print(f"pipeline: {msg}", file=sys.stderr, flush=True)


def run_pipeline(plan: PipelinePlan, steps: int = 3, options: dict | None = None,
                 stage_memory: bool = True) -> PipelineReport:
    """S teacher-forced and S free-running steps of ``plan``, against one device.

    ``options``: XLA compile options for every program (the pipeline's and the one-device
    references alike); ``stage_memory``: also compile each stage alone for its temp bytes.
    """
    opt, t0 = plan.optimizer, plan.trainable
    check_finite_loss(plan.loss, t0, plan.batch)
    s0 = jax.jit(opt.init)(t0)
    groups = plan.mesh_shape.get("data", 1) * plan.microbatches
    _progress(f"compiling the {plan.stages}-stage program and the one-device references")
    compiled = plan.compile(options)
    narrow = _narrow(plan, groups)
    random = draws_random(plan.split.closed)
    refs_fn, update, twin = one_device.programs(plan, groups, options, s0=s0, random=random,
                                                narrow=_dtype_names(narrow) or None)
    verdict, t, s = PipelineVerdict(), t0, s0
    for k in range(steps):
        _progress(f"teacher-forced step {k + 1}/{steps}")
        refs = jax.device_get(refs_fn(t, plan.batch))
        refs.update({k: (*refs[k], *jax.device_get(update(refs[k][1], s, t))) for k in "ABC"})
        refs.update(twin(t, plan.batch) or {})
        got = plan.step(t, s, options)
        judge_step(verdict, refs, got, lambda g: jax.device_get(update(g, s, t))[0],  # noqa: B023 (called in this iteration)
                   narrow, stochastic=random)
        ref = refs["A" if verdict.separable_steps[0] and not random else "B"]
        t, s = ref[2], ref[3]
    free_t, free_s = t0, s0
    for k in range(steps):
        _progress(f"free-running step {k + 1}/{steps}")
        last = plan.step(free_t, free_s, options)
        free_t, free_s = last["params"], last["opt_state"]
    free = {"params": max(leaf_diffs(free_t, t))}
    separable = all(verdict.separable_steps)
    exact, reason = _reason(plan, verdict, separable)
    if narrow is not None:
        reason += f"; {_precision(narrow, twin)}"
    notes = [twin.note] if twin.note else []
    tf = {q: verdict.worst[q] for q in QUANTITIES + ("separability",)}
    stochastic = None
    if random:
        exact, reason, stochastic, off = _stochastic(plan, verdict, separable, reason, steps,
                                                     options)
        if off is not None:   # the verdict is the dropout-off run's: so is its table
            tf, notes = off.teacher_forced, notes + off.notes
            verdict.worst["optimizer"] = off.optimizer_check
    log, log_mb = last["log"], last["log_mb"]
    in_flight = figures.executed_in_flight(log)
    bubble = figures.executed_bubble(log, plan.microbatches)
    bubble["table"] = plan.schedule.bubble_fraction()
    data = plan.mesh_shape.get("data", 1)
    _progress("reading the compiled program's point-to-point traffic and memory")
    p2p = figures.point_to_point(compiled.as_text(), last["sends"], plan.split,
                                 plan.microbatches, plan.stages, data)
    memory = figures.stage_memory(plan, in_flight, compiled, options, stage_memory)
    times = plan.stage_times_us
    mean = sum(times) / len(times)
    stages = [{"units": [plan.units.units[k].name for k in range(lo, hi)],
               "estimated_us": t_us, "params_bytes": b}
              for (lo, hi), t_us, b in zip(ranges_of(plan.stage_of_unit), times,
                                           plan.leaves.bytes_per_stage())]
    return PipelineReport(
        mesh=dict(plan.mesh_shape), schedule=plan.schedule.name, microbatches=plan.microbatches,
        remat=plan.remat, steps=steps, exact=exact, reason=reason, separable=separable,
        teacher_forced=tf,
        optimizer_check=verdict.worst["optimizer"], max_abs_diff=free,
        units=[u.name for u in plan.units.units], unit_source=plan.units.source,
        split_given=plan.split_given, stages=stages,
        balance={"hw": plan.hw, "max_over_mean": max(times) / mean,
                 "min_over_mean": min(times) / mean},
        bubble=bubble,
        in_flight={"executed": in_flight, "table": list(plan.schedule.in_flight_peaks()),
                   "buffer_rows": plan.program.rows},
        p2p=p2p, memory=memory, stacked=figures.stacked_share(plan),
        replica_spread=last["replica_spread"],
        timeline=figures.timeline_table(log, log_mb), notes=notes, stochastic=stochastic)


def _narrow(plan: PipelinePlan, groups: int) -> NarrowLeaves | None:
    """The leaves computed in a dtype less precise than float32, or None if none is."""
    loss, grads = gradient_dtypes(plan.loss, plan.trainable, plan.batch,
                                  closed=plan.split.closed)
    return NarrowLeaves(loss, grads, groups) if any(loss + grads) else None


def _dtype_names(narrow: NarrowLeaves | None) -> str:
    return "/".join(sorted({d for d in narrow.loss + narrow.grads if d})) if narrow else ""


def _precision(narrow: NarrowLeaves, twin: Float64Twin) -> str:
    """The sentence naming the dtype the bound comes from."""
    dtype = _dtype_names(narrow)
    which = " and ".join(q for q, ds in (("loss", narrow.loss), ("gradients", narrow.grads))
                         if any(ds))
    sep = ("separability from the float64 twin (the model's jaxpr with its " + dtype
           + " arithmetic in float64)" if twin.fn is not None else
           "separability from " + dtype + "'s noise alone")
    return (f"the {which} compute in {dtype}, so their bound is {dtype}'s: {NOISE_MARGIN:g} × "
            f"the noise of the equivalent one-device computations plus {narrow.reductions} "
            f"{dtype} ulp(s) at a leaf's largest microbatch term (one per partial result), for "
            f"the max and for the rms over each leaf; {sep}")


def _reason(plan: PipelinePlan, verdict: PipelineVerdict, separable: bool) -> tuple[bool, str]:
    w = verdict.worst
    worst = max(QUANTITIES, key=lambda q: w[q]["ratio"])
    off = (f"max |Δ{worst}| {w[worst]['diff']:.3g} > bound {w[worst]['bound']:.3g} "
           f"(noise {w[worst]['noise']:.3g})")
    opt_ok = verdict.within("optimizer")
    opt_off = (f"the optimizer on the stages differs from optax on one device given the same "
               f"gradients: max |Δ| {w['optimizer']['diff']:.3g} > {w['optimizer']['bound']:.3g}")
    if not separable:
        sep = w["separability"]
        if not all(verdict.within(q) for q in QUANTITIES):
            same = f"and the pipeline does not even compute that: {off}"
        else:
            same = ("the pipeline computes exactly that (within the noise)" if opt_ok else
                    f"the pipeline computes that, but {opt_off}")
        return False, (f"not separable over microbatches: whole-batch and per-microbatch "
                       f"{'gradients' if sep['diff'] else 'losses'} differ by {sep['diff']:.3g} "
                       f"(noise {sep['noise']:.3g}); "
                       + "; ".join(causes(plan.split.closed, plan.paths)) + f"; {same}")
    if not all(verdict.within(q) for q in QUANTITIES):
        return False, f"the pipeline differs from one device beyond the rounding noise: {off}"
    if not opt_ok:
        return False, opt_off
    g = w["grads"]
    return True, (f"separable over microbatches; loss, gradients and new parameters equal one "
                  f"device's, step by step, within the calibrated noise (worst: {worst} "
                  f"{w[worst]['diff']:.3g} <= {w[worst]['bound']:.3g}; gradients "
                  f"{g['diff']:.3g}, noise {g['noise']:.3g})")


SAME_BITS = ("stochastic: the same random bits as one device (the loss draws per example, "
             "from keys split with the batch's rows)")
WHOLE_BATCH = ("the loss draws its masks for the whole batch at once (one key of the batch, or a "
               "key fixed inside it), so microbatches draw other masks than one device does")


def _stochastic(plan: PipelinePlan, verdict: PipelineVerdict, separable: bool, reason: str,
                steps: int, options) -> tuple:
    """The verdict of a loss that draws random numbers: ``(exact, reason, json, off_report)``.
    Where the whole batch draws what the microbatches draw (keys per example), the usual
    verdict against the same bits; where it does not, no one-device reference draws the
    pipeline's bits, so exactness is judged with dropout off (``loss_fn(...,
    deterministic=True)``, planned and run again), or not claimed."""
    on = {q: dict(verdict.worst[q]) for q in QUANTITIES + ("optimizer",)}
    info = {"same_bits": separable, "compared_with": None, "dropout_on": on}
    if separable:
        info["compared_with"] = "the same random bits"
        return _exact(verdict), f"{SAME_BITS}; {reason}", info, None
    on_ok = _exact(verdict)
    worst = max(QUANTITIES + ("optimizer",), key=lambda q: verdict.worst[q]["ratio"])
    w = verdict.worst[worst]
    mine = ("the pipeline computes exactly its microbatches' own draws (within the noise)"
            if on_ok else f"the pipeline does not compute its microbatches' own draws either: "
            f"max |Δ{worst}| {w['diff']:.3g} > bound {w['bound']:.3g}")
    if plan.dropout_off is None:
        return False, (f"stochastic: not claimed exact: {WHOLE_BATCH}; pass one key per "
                       f"example (jax.random.split(key, B)) or give loss_fn a '{OFF_FLAG}' "
                       f"keyword; {mine}"), info, None
    _progress(f"stochastic: planning and checking the step again with {OFF_FLAG}=True")
    off_plan = plan.dropout_off()
    if draws_random(off_plan.split.closed):
        return False, (f"stochastic: not claimed exact: {WHOLE_BATCH}, and loss_fn(..., "
                       f"{OFF_FLAG}=True) still draws random numbers; {mine}"), info, None
    off = run_pipeline(off_plan, steps, options, stage_memory=False)
    info["compared_with"] = "dropout off"
    return off.exact and on_ok, (f"stochastic: compared with dropout off (loss_fn(..., "
                                 f"{OFF_FLAG}=True)): {off.reason}; with dropout on, {WHOLE_BATCH}"
                                 f"; {mine}"), info, off


def _exact(verdict: PipelineVerdict) -> bool:
    """Every quantity and the optimizer within its bound."""
    return all(verdict.within(q) for q in QUANTITIES + ("optimizer",))
