"""One call that plans at a budget and returns every figure a report of the plan shows.

``Frontier.plan`` answers with the plan alone; a report (the ``remat`` command, a notebook) also
wants what the answer was chosen among — each compiled program's temp bytes and step time — and
JAX's built-in policies compiled (those that could matter — fewer temp bytes than no remat,
within the budget — timed in the same rounds, which stop once the outcome is settled:
``planner.rounds``). Doing that needs the frontier's
steps in a different order (the policies join the plans' timing session), so it lives here, in
the library, once: ``plan_report`` returns a ``PlanReport`` and callers only format it. On
``ShapeDtypeStruct`` parameters and batch nothing can run, so the same call plans on shapes
(``remat.planner.shapes``) and returns a ``ShapesPlanReport``; ``.abstract`` says which.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mlsys_jax.errors import MlsysError
from mlsys_jax.progress import SILENT, Progress
from mlsys_jax.remat.milp import Plan, plan_key
from mlsys_jax.remat.planner.budget import Budget, parse_budget
from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.remat.planner.shapes import ShapesPlanReport, json_figures, plan_on_shapes

# the keys of ``PlanReport.to_dict`` (``mlsys-jax remat --json``), in order
JSON_KEYS = ("budget_bytes", "predicted_peak_bytes", "compiled_temp_bytes", "compiled_flops",
             "step_time_ratio", "grads_max_abs_diff", "saved", "recomputed", "policies",
             "abstract")


@dataclass(frozen=True)
class CompiledProgram:
    """One program compiled while planning: its label (``no remat``, ``plan 3``) and plan."""

    label: str
    plan: Plan


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    """The chosen plan at a budget, what it was chosen among, and JAX's policies beside it."""

    abstract = False                # planned on arrays: timed and checked (not a field)
    budget: Budget                  # as the user said it
    budget_bytes: int               # compiled temp bytes the plan had to fit (the least: its own)
    plan: Plan                      # the answer, with its compiled figures
    no_remat: Plan                  # the user's own gradient, compiled
    step_time_ratio: float | None   # the plan's median paired step time over no remat's
    grads_max_abs_diff: float       # the plan's gradients against jax.grad
    grads_max_rel_diff: float       # … relative to max |g|
    compiled: tuple[CompiledProgram, ...]    # every program compiled, in compile order
    timings: dict                   # plan_key -> timing.Ratio to no remat (None: the reference)
    compile_seconds: float          # lowering and compiling all of ``compiled``
    zero_grad_leaves: int           # gradient leaves exactly zero in jax.grad itself
    n_grad_leaves: int
    shapes: dict                    # value name -> its shape, as the graph prints it
    versus: dict                    # policies.compare_policies (empty lists: --no-policies)
    timelines: dict                 # "no remat" (and "the plan") -> the planner's memory model
    choice: str = ""                # how the plan was chosen among the timed ones (the noise)
    timing_note: str = ""           # how many timing rounds ran, and why they stopped
    labels: dict = field(default_factory=dict)  # value name -> module/primitive (value_names)

    def ratio(self, p: Plan):
        """``(is the reference, timing.Ratio | None)`` of a compiled plan's step time."""
        key = plan_key(p)
        return key == plan_key(self.no_remat), self.timings.get(key)

    def to_dict(self) -> dict:
        """The ``JSON_KEYS`` figures (the command's ``--json``)."""
        return json_figures(self.budget_bytes, self.plan, step_time_ratio=self.step_time_ratio,
                            grads_max_abs_diff=self.grads_max_abs_diff,
                            policies=self.versus["policies"], abstract=False)


def plan_report(loss_fn, params, batch, budget, *, repeats: int = 7, policies: bool = True,
                progress: Progress = SILENT) -> PlanReport | ShapesPlanReport:
    """Plan ``jax.grad(loss_fn)`` at ``budget`` (as ``Frontier.plan``), time the plans that fit
    beside no remat and, with ``policies``, JAX's built-in policies in the same rounds. On
    shapes (``ir.abstract.is_abstract``) nothing runs: ``planner.shapes.plan_on_shapes``."""
    from mlsys_jax.ir.abstract import is_abstract
    from mlsys_jax.remat.planner.policies import compare_policies, distinct, policy_programs
    from mlsys_jax.remat.planner.value_names import value_names

    if not isinstance(repeats, int) or repeats < 1:
        raise MlsysError(f"--repeats must be a positive int, got {repeats!r}")
    wanted = parse_budget(budget)                      # a bad budget fails before any work
    if is_abstract((params, batch)):
        return plan_on_shapes(loss_fn, params, batch, wanted, policies=policies,
                              progress=progress)
    fr = Frontier(loss_fn, params, batch, repeats=repeats, progress=progress)
    nbytes = wanted.bytes_of(fr.no_remat.compiled_temp_bytes)
    if nbytes is None:
        fr.compile_least()
        candidates = [fr.choose(None)]
    else:
        candidates = fr.search(nbytes)[:fr.n_timed()]
        if not candidates:
            raise fr.refusal(nbytes)
    built = policy_programs(fr, quick=True) if policies else {}
    # policies that save nothing, or not enough to fit: not timed (for min, the least reached)
    worth, skipped = distinct(fr, built, budget_bytes=candidates[0].compiled_temp_bytes
                              if nbytes is None else nbytes)
    times = fr.time(candidates, extra=worth.values(), sequential=True)
    chosen = fr.choose(nbytes)
    versus = compare_policies(fr, built, times, candidates, skipped)
    prog = fr.program(chosen)
    timelines = {"no remat": fr.problem.timeline(fr.no_remat)}
    if chosen.recomputed and not chosen.scan_policy:      # the MILP's model: its plans only
        timelines["the plan"] = fr.problem.timeline(chosen)
    return PlanReport(
        budget=wanted, budget_bytes=chosen.budget_bytes, plan=chosen, no_remat=fr.no_remat,
        step_time_ratio=fr.step_time_ratio(chosen), grads_max_abs_diff=prog.grads_max_abs_diff,
        grads_max_rel_diff=prog.grads_max_rel_diff,
        compiled=tuple(CompiledProgram(fr.labels[plan_key(q)], q) for q in fr.measured),
        timings=dict(fr.timings), compile_seconds=sum(fr.program(q).compile_s
                                                      for q in fr.measured),
        zero_grad_leaves=fr.programs.zero_grad_leaves, n_grad_leaves=len(fr.flat.diff),
        shapes=dict(zip(fr.graph.names, fr.graph.shapes)), versus=versus, timelines=timelines,
        choice=fr.choice, timing_note=fr.timing_note, labels=value_names(fr.graph, params))
