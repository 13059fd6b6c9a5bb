"""``mlsys_jax.optimize``: verified rewrites of a function, from Python (``mlsys-jax optimize``).

The command's computing part (``cli/commands/optimize.py``: ``compute``, which calls the
library's ``passes.optimize_report``) does the work; the result shows the command's report.
"""
from __future__ import annotations

from mlsys_jax.api.bridge import namespace, precision, user_target
from mlsys_jax.api.result import ApiResult
from mlsys_jax.api.speak import Say, speaking

FLAGS = {"passes": Say("passes"), "search": Say("search", "bool"), "alpha": Say("alpha"),
         "budget": Say("search_budget"), "measure": Say("measure", "bool"),
         "rounds": Say("rounds"), "measure-budget": Say("measure_budget"), "hw": Say("hw"),
         "dtype": Say("dtype"), "ops": Say("table(ops=True)", "literal"),
         "arg": Say("args", "literal"), "x64": Say("x64", "bool"),
         "abstract": Say("abstract", "bool"), "json": Say("to_json()", "literal"),
         "import-timeout": Say("import_timeout", "literal")}


class OptimizeResult(ApiResult):
    """``mlsys_jax.optimize``'s result: ``verified`` and ``verdict`` (the value check),
    ``after`` (the optimized ClosedJaxpr), ``repr`` the verdict and the estimated speed-up,
    ``table()`` the command's report (``table(ops=True)``: every kernel), ``to_json()``."""

    command = "optimize"
    flags = FLAGS

    def __init__(self, run, *, name: str, args):
        self.run, self._args = run, args
        super().__init__(run.to_json(), name=name)

    @property
    def verified(self) -> bool:
        return self.run.done.verified

    @property
    def verdict(self) -> str:
        return self.run.done.verdict

    @property
    def before(self):
        return self.run.done.before

    @property
    def after(self):
        return self.run.done.after

    def table(self, *, ops: bool = False) -> str:
        """The report (``ops=True``: the per-kernel tables however long)."""
        self._args.ops = ops
        return super().table()

    def _text(self) -> None:
        from mlsys_jax.cli.commands import optimize as command

        command.print_text(self._args, self.run)

    def _lines(self) -> list[str]:
        from mlsys_jax.cli.headline import speedup_line

        done = self.run.done
        rules = sorted({r["rule"] for r in done.rewrites})
        failure = f" — {done.failure}" if done.failure else ""
        return [f"optimize {self.name}: verified: {done.verdict}{failure}",
                speedup_line(self.run.before_e, self.run.after_e),
                f"{len(done.rewrites)} rewrite(s) applied{' (' + ', '.join(rules) + ')' if rules else ''}"
                f", {len(done.refusals)} refused"]


def optimize(f, *args, constants: bool = True, passes=None, search: bool = False,
             alpha: float | None = None, search_budget: int | None = None,
             measure: bool = False, rounds: int = 11, measure_budget: float | None = None,
             hw: str = "h100", dtype: str | None = None, abstract: bool = False,
             x64: bool | None = None) -> OptimizeResult:
    """Apply verified rewrite passes to ``f(*args)`` and check the values, as
    ``mlsys-jax optimize``.

    ``f`` and ``args`` as for :func:`mlsys_jax.inspect` (a factory alone, or the function and
    its arguments). ``constants``: the first argument (the parameters) becomes constants of the
    graph, which is what lets BatchNorm fold into a convolution, as the command does with a
    factory's parameters; False keeps every argument an input. ``passes`` (a list or
    ``"dce,cse"``) or ``search=True`` (with ``alpha``, ``search_budget`` graphs) choose the
    rewrites; the other keywords are the command's flags.
    """
    from mlsys_jax.cli import user_code
    from mlsys_jax.cli.commands import optimize as command
    from mlsys_jax.cli.target import factories_on_shapes

    if isinstance(passes, (list, tuple)):
        passes = ",".join(passes)
    given = dict(passes=passes, alpha=alpha, search_budget=search_budget, rounds=rounds,
                 measure_budget=measure_budget, hw=hw, dtype=dtype)
    with speaking(FLAGS, given):
        ns = namespace("optimize", passes=passes, search=search, alpha=alpha,
                       budget=search_budget, measure=measure, rounds=rounds,
                       measure_budget=measure_budget, hw=hw, dtype=dtype, json=True,
                       abstract=abstract, x64=bool(x64))

        def resolve(ns):
            user = user_target(f, args, ns)
            return user if constants or not user.examples else _no_constants(user)

        with precision(x64), user_code.time_bound(None), factories_on_shapes(abstract):
            run = command.compute(ns, resolve)
    return OptimizeResult(run, name=run.user.name, args=ns)


def _no_constants(user):
    """The Target with every argument an input: an empty first argument takes the place the
    command gives the parameters (closed over as constants: nothing)."""
    from dataclasses import replace

    fn = user.fn
    return replace(user, fn=lambda _nothing, *rest: fn(*rest), args=((), *user.args))
