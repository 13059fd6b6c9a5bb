"""``mlsys_jax.inspect``: a function as a costed graph, from Python (``mlsys-jax inspect``).

The command's computing part (``cli/commands/inspect.py``: ``compute``) does the work on the
function and its arguments; the result shows the command's tables and ``--json`` object.
"""
from __future__ import annotations

from mlsys_jax.api.bridge import namespace, precision, user_target
from mlsys_jax.api.result import ApiResult
from mlsys_jax.api.speak import Say, speaking

FLAGS = {"hw": Say("hw"), "dtype": Say("dtype"), "grad": Say("grad", "bool"),
         "fused": Say("fused", "bool"), "unfused": Say("fused=False", "literal"),
         "depth": Say("depth"), "ops": Say("table(ops=True)", "literal"),
         "jaxpr": Say(".jaxpr", "literal"), "measure": Say("measure", "bool"),
         "rounds": Say("rounds"), "measure-budget": Say("measure_budget"),
         "xla": Say("xla", "bool"), "arg": Say("args", "literal"), "x64": Say("x64", "bool"),
         "abstract": Say("abstract", "bool"), "json": Say("to_json()", "literal"),
         "plot": Say("plot", "literal"), "import-timeout": Say("import_timeout", "literal")}


class InspectResult(ApiResult):
    """``mlsys_jax.inspect``'s result: ``repr`` the totals and the estimate, ``table()`` the
    module table (``table(ops=True)``: one row per kernel), ``to_json()`` the command's
    ``--json`` object; ``jaxpr`` the traced ClosedJaxpr, ``run`` every object computed."""

    command = "inspect"
    flags = FLAGS

    def __init__(self, run, *, name: str, args):
        self.run, self._args = run, args
        super().__init__(run.to_json(), name=name)

    @property
    def jaxpr(self):
        return self.run.closed

    def table(self, *, ops: bool = False) -> str:
        """The module table, totals and estimate (``ops=True``: the table per kernel)."""
        self._args.ops = ops
        return super().table()

    def _text(self) -> None:
        from mlsys_jax.cli import shapes
        from mlsys_jax.cli.commands import inspect as command

        r = self.run
        if r.on_shapes:
            print(shapes.notice())
        command._print_tables(self._args, r.closed, r.both, r.report, r.summary, r.equations,
                              r.measured, r.xla, xla_error=getattr(r, "xla_error", ""))

    def _lines(self) -> list[str]:
        r = self.run
        t, node = r.report.totals(), r.summary.node
        params = f"; {node.params:,} parameters" if node.params else ""
        lines = [f"inspect {self.name}: {t['flops'] / 1e9:.4g} GFLOP, {t['bytes'] / 1e6:.4g} MB "
                 f"moved, peak live {t['peak_bytes'] / 1e6:.4g} MB{params}",
                 f"estimate: {r.both.line()}"]
        return lines


def inspect(f, *args, hw: str = "h100", dtype: str | None = None, grad: bool = False,
            fused: bool | None = None, depth: int | None = None, measure: bool = False,
            rounds: int = 11, measure_budget: float | None = None, xla: bool | None = None,
            abstract: bool = False, x64: bool | None = None) -> InspectResult:
    """Trace ``f(*args)`` and cost its graph per module of the model, as ``mlsys-jax inspect``.

    ``f`` with ``args``: the function and its arguments (arrays or pytrees, parameters first;
    ``jax.ShapeDtypeStruct``\\ s or specs like ``"f32[8,32]"`` for shapes). ``f`` alone: a
    factory returning ``(f, args)`` — ``"file.py:make"`` or the zero-argument function. The
    keywords are the command's flags (``hw="cpu"``, ``grad=True``, ``measure=True``; ``xla``:
    XLA's figures beside ours, None: the command's default) ...;
    ``x64`` runs the user's code under float64 (True) or float32 (False) instead of JAX's
    current setting.
    """
    from mlsys_jax.cli import user_code
    from mlsys_jax.cli.commands import inspect as command
    from mlsys_jax.cli.target import factories_on_shapes

    given = dict(hw=hw, dtype=dtype, depth=depth, rounds=rounds, measure_budget=measure_budget)
    with speaking(FLAGS, given):
        ns = namespace("inspect", hw=hw, dtype=dtype, grad=grad, fused=fused, depth=depth,
                       measure=measure, rounds=rounds, measure_budget=measure_budget,
                       json=True, abstract=abstract, x64=bool(x64),
                       **({} if xla is None else {"xla": xla}))
        with precision(x64), user_code.time_bound(None), factories_on_shapes(abstract):
            command.check_measure_options(ns)
            user = user_target(f, args, ns)
            run = command.compute(user, ns)
    return InspectResult(run, name=user.name, args=ns)
