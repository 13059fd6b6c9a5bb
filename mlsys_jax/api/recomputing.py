"""``mlsys_jax.remat``: a recomputation plan for a loss under a memory budget, from Python
(``mlsys-jax remat``).

The library's one entry, ``remat.planner.report.plan_report``, does the work (through the
command's ``report`` when the caller gives a factory, which loads it as the command does); the
result shows the command's report. ``mlsys_jax.remat`` is also the package of the planners:
the package answers the call (``mlsys_jax/remat/__init__.py``).
"""
from __future__ import annotations

from mlsys_jax.api.bridge import display_name
from mlsys_jax.api.result import ApiResult
from mlsys_jax.api.speak import Say, speaking

FORM = "(loss_fn, params, batch)"
FLAGS = {"budget": Say("budget"), "repeats": Say("repeats"),
         "no-policies": Say("policies=False", "literal"), "quiet": Say("progress=False", "literal"),
         "plot": Say("plot", "literal"), "json": Say("to_json()", "literal"),
         "abstract": Say("abstract", "bool")}


class RematResult(ApiResult):
    """``mlsys_jax.remat``'s result: ``plan`` (the chosen ``remat.milp.Plan``), ``repr`` the
    budget, the plan and its compiled figures, ``table()`` the command's report, ``to_json()``
    its ``--json`` object; ``report`` the library's whole report."""

    command = "remat"
    flags = FLAGS

    def __init__(self, report, *, name: str):
        self.report = report
        super().__init__(report.to_dict(), name=name)

    @property
    def plan(self):
        return self.report.plan

    def _text(self) -> None:
        from mlsys_jax.cli.commands import remat as command

        show = command.print_shapes if self.report.abstract else command.print_text
        show(self.name, self.report)

    def _lines(self) -> list[str]:
        from mlsys_jax.cli.commands import remat as command
        from mlsys_jax.remat.planner.budget import percent

        out, p = self.report, self.report.plan
        t0 = out.no_remat.compiled_temp_bytes
        lines = [f"remat {self.name}: budget {out.budget_bytes:,} bytes of XLA temp "
                 f"({out.budget.describe(t0)}; no remat compiles to {t0:,})",
                 f"plan: {command.describe(p)}"]
        figures = (f"compiled temp bytes {p.compiled_temp_bytes:,} "
                   f"({percent(p.compiled_temp_bytes, t0)} of no remat's)")
        if not out.abstract:
            figures += (f"; step time ratio {command._ratio_text(out, p)}; grads max |Δ| vs "
                        f"jax.grad {out.grads_max_abs_diff:.3g}")
        return lines + [figures]


def remat(target, *values, budget, repeats: int = 7, policies: bool = True,
          progress: bool = True, abstract: bool = False) -> RematResult:
    """Plan recomputation for ``jax.grad(loss_fn)`` within ``budget``, as ``mlsys-jax remat``.

    ``target`` is ``loss_fn`` followed by ``params, batch``, or a factory returning
    ``(loss_fn, params, batch[, optimizer[, rules]])`` — ``"file.py:make"`` or the zero-argument
    function. ``budget``: XLA temp bytes (``2_000_000``, ``"700MB"``), a percentage of no
    remat's (``"60%"``) or ``"min"``. ``policies=False`` skips JAX's built-in policies;
    ``progress`` reports the stages on stderr.
    """
    import jax

    from mlsys_jax.cli import user_code
    from mlsys_jax.cli.commands import remat as command
    from mlsys_jax.cli.target import factories_on_shapes
    from mlsys_jax.errors import MlsysError
    from mlsys_jax.progress import Progress
    from mlsys_jax.remat.planner.report import plan_report

    given = dict(budget=budget, repeats=repeats)
    bar = Progress("mlsys-jax remat", enabled=progress)
    try:
        with speaking(FLAGS, given):
            if values:
                if len(values) != 2 or isinstance(target, str):
                    raise MlsysError(f"remat: give loss_fn, params, batch (or a factory alone "
                                     f"returning {FORM}); got {1 + len(values)} value(s)")
                out = plan_report(target, *values, budget, repeats=repeats, policies=policies,
                                  progress=bar)
            else:  # the factory's model runs under JAX's defaults, as with the command
                with jax.enable_x64(False), user_code.time_bound(None), \
                        factories_on_shapes(abstract):
                    out = command.report(target, budget, repeats=repeats, policies=policies,
                                         progress=bar)
    finally:
        bar.done()
    return RematResult(out, name=display_name(target))
