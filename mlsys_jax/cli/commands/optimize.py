"""``mlsys-jax optimize FILE.py:FN [--arg SPEC ...] [--passes LIST | --search [--budget N]] [--measure]``.

Applies verified passes (or the TASO-style search, which starts from the default pipeline's result
and so never loses to it) to a user's function — a factory's parameters
are constants, so this is an inference graph — and prints the op tables before and after, the
rewrites applied (and refused, with reasons), the unfused and fused estimates, the value check
(:mod:`mlsys_jax.passes.value_check`: per element, on the example inputs and fresh ones) and, with
``--measure``, both graphs timed here under ``jax.jit``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from mlsys_jax.cli import target
from mlsys_jax.errors import MlsysError

HELP = "apply verified rewrite passes to a function"
SEARCH_BUDGET = 100  # graphs; after the pipeline's result the moves are few, so it rarely binds
SEARCH_MEASURED = 4  # with --search --measure: graphs timed beside the original
OPS_SHOWN = 40  # kernels: longer per-kernel tables are left to --ops (the module table stays)


def add_arguments(p) -> None:
    target.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--passes", default=None, metavar="PASS,...",
                   help="comma-separated passes (default: the standard pipeline)")
    p.add_argument("--search", action="store_true", help="cost-based search over rewrites")
    p.add_argument("--alpha", type=float, default=None,
                   help="search: keep graphs costing < alpha × the best (default 1.05; 1 = greedy)")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help=f"search: at most N graphs explored (default {SEARCH_BUDGET})")
    p.add_argument("--measure", action="store_true",
                   help="compile original and optimized with jax.jit and time them here")
    p.add_argument("--rounds", type=int, default=11, metavar="N",
                   help="interleaved timing rounds for --measure (default 11)")
    p.add_argument("--ops", action="store_true",
                   help=f"print everything row by row: the per-kernel tables before and after "
                        f"even beyond {OPS_SHOWN} rows, each module's rules, every rewrite and "
                        "refusal (grouped by rule otherwise)")
    p.add_argument("--constants", default=None, metavar="ARG,...",
                   help="the factory's arguments folded in as constants, by 0-based index or "
                        "parameter name (default: the first, the parameters)")
    from mlsys_jax.cli.measured import add_budget_argument

    add_budget_argument(p)


def _summary(both) -> dict:
    return {**both.totals(), "primitives": dict(both.unfused.primitives)}


def main(args) -> int:
    from mlsys_jax.progress import SlowStages

    with SlowStages("mlsys-jax optimize") as progress:
        run = compute(args, target.resolve, progress)
    if args.json:
        print(json.dumps(run.to_json(), indent=1))
    else:
        print_text(args, run)
    return 0 if run.done.verified else 1


@dataclass
class OptimizeRun:
    """What ``optimize`` computed (:func:`compute`): the user's Target, the library's report
    (``passes.optimize_report``), both estimates before and after, the per-module rows."""

    user: Any
    done: Any
    before_e: Any
    after_e: Any
    per_module: list

    def to_json(self) -> dict:
        """The ``--json`` object."""
        done = self.done
        return {"before": _summary(self.before_e), "after": _summary(self.after_e),
                "rewrites": done.rewrites, "refusals": done.refusals, "modules": self.per_module,
                **done.check.to_dict(),
                **({"measured": done.measured} if done.measured else {}),
                **({"search": done.searched} if done.searched else {}),
                "verified": done.verified, "verdict": done.verdict, "error": done.failure}


def compute(args, resolve, progress=None) -> OptimizeRun:
    """The computing part of ``optimize``, shared by :func:`main` and the Python API
    (``mlsys_jax.optimize``): the options are checked, then ``resolve(args)`` gives the Target
    (the command loads ``FILE.py:FN``; the API passes its own), and the passes run verified."""
    from mlsys_jax.cli.headline import Estimates
    from mlsys_jax.cli.limits import check_optimize_fits  # imports JAX: not for --help
    from mlsys_jax.cli.measured import check_here_options
    from mlsys_jax.cli.per_module import Inputs
    from mlsys_jax.passes.optimize_report import optimize_report
    from mlsys_jax.passes.registry import pipeline as named_pipeline

    if args.search and args.passes is not None:
        raise MlsysError("--search chooses its own rewrites; drop --passes (or drop --search)")
    if not args.search and (args.alpha is not None or args.budget is not None):
        raise MlsysError("--alpha and --budget set the search; add --search (or drop them)")
    alpha = 1.05 if args.alpha is None else args.alpha
    budget = SEARCH_BUDGET if args.budget is None else args.budget
    if not alpha >= 1.0:
        raise MlsysError(f"--alpha must be ≥ 1.0 (1.0 = greedy), got {alpha}")
    if budget < 1:
        raise MlsysError(f"--budget must be ≥ 1 graph, got {budget}")
    if args.rounds < 1:
        raise MlsysError(f"--rounds must be a positive integer, got {args.rounds}")
    check_here_options(args)
    pipeline = None if args.search else named_pipeline(args.passes, source="--passes")
    from mlsys_jax.cli.constants import with_constants

    from mlsys_jax.progress import SILENT

    progress = progress or SILENT
    user = with_constants(resolve(args), getattr(args, "constants", None))
    _refuse_shapes(user)
    progress.stage(f"tracing {user.name}")
    closed = user.trace(constant_params=True)
    if not closed.jaxpr.outvars:
        raise MlsysError(f"optimize: {user.name} returns no outputs (None?): there is nothing to "
                         "optimize or check; return the values the model computes")
    check_optimize_fits(closed, f"optimize of {user.name}")
    inputs_of = Inputs()  # the graph each rewrite's path refers to
    done = optimize_report(closed, user.inputs(constant_params=True), pipeline=pipeline,
                           search=args.search, alpha=alpha, search_budget=budget,
                           search_measured=SEARCH_MEASURED if args.measure else 0,
                           hw=args.hw, dtype=args.dtype,
                           rounds=args.rounds if args.measure else None, observe=inputs_of,
                           progress=progress)
    before_e = Estimates(done.before_unfused, done.before_fused)
    after_e = Estimates(done.after_unfused, done.after_fused)
    per_module = _per_module(user, done, before_e, after_e, inputs_of)
    return OptimizeRun(user, done, before_e, after_e, per_module)


def print_text(args, run: OptimizeRun) -> None:
    """The text report: the op tables before and after, the module table, the search's path,
    the rewrites and refusals, the estimates, the timing and the value check."""
    from mlsys_jax.cli.headline import (compiler_note, measured_line,
                                        predicted_beside_measured_line, search_title,
                                        speedup_line)
    from mlsys_jax.cli.measured import table_columns
    from mlsys_jax.tables import format_table, wrap

    done, before_e, after_e, per_module = run.done, run.before_e, run.after_e, run.per_module
    rewrites, refusals, searched, measured = (done.rewrites, done.refusals, done.searched,
                                              done.measured)
    check, verdict, failure = done.check, done.verdict, done.failure
    hw = before_e.unfused.hardware
    for label, both in (("before", before_e), ("after", after_e)):
        title = f"\n[{label} on {hw.name}, {args.dtype or 'native dtypes'}: {both.line()}]"
        if not (args.ops or len(before_e.default.kernels) <= OPS_SHOWN):
            print(wrap(title.strip("\n"), first="", rest=" "))
            continue
        columns = ("name", "in", "out", "flops", "bytes", "time_us",
                   *table_columns(both.default))
        rows = [{k: r[k] for k in columns} for r in both.default.rows()]
        print("\n" + wrap(title.strip("\n"), first="", rest=" "))
        print(format_table(rows))
    _print_modules(per_module, before_e, args.ops or len(before_e.default.kernels) <= OPS_SHOWN,
                   every=args.ops)
    if searched:
        print(format_table(searched["path"], title="\n" + search_title(searched)))
    _print_rewrites(rewrites, refusals, every=args.ops)
    print("\n" + wrap(speedup_line(before_e, after_e) + f" — {compiler_note(hw)}", first=""))
    if measured:
        print(wrap(measured_line(measured, hw), first=""))
        print(wrap(predicted_beside_measured_line(measured, hw), first=""))
    first = "the example inputs" if run.user.examples else "seeded random inputs"
    print(wrap(f"verified: {verdict}{' — ' + failure if failure else ''}; max |output diff| on "
               f"{first} and {check.inputs - 1} fresh input set(s) drawn like them: "
               f"{check.max_abs_diff:.3g} (per element: {check.tolerance or 'exact'}"
               f"{_past_tolerance(check)})", first=""))


def _past_tolerance(check) -> str:
    """How many elements were past the plain tolerance and within the float64 twin's bound
    (``passes.value_check``), if any."""
    n = getattr(check, "within_twin", 0)
    return (f"; {n} element(s) past it, within the float64 twin's rounding bound" if n else "")


def _per_module(user, done, before_e, after_e, inputs_of) -> list[dict]:
    """The module table before and after (``cli.per_module``), each rewrite and refusal given
    its ``module``."""
    from mlsys_jax.cli.per_module import compare, modules_of
    from mlsys_jax.cli.summary import summarize, weights_of

    closed, after, logged = done.before, done.after, done.logged
    weights = lambda g: weights_of(user, g, constant_params=True)  # noqa: E731
    before = summarize(before_e, weights(closed))
    located = {"rewrites": [], "refusals": []}
    if logged is not None:
        for key, entries, rows, default in (("rewrites", logged.rewrites, done.rewrites, closed),
                                            ("refusals", logged.refusals, done.refusals, after)):
            for row, m in zip(rows, modules_of(entries, inputs_of, default, weights)):
                row["module"] = "/".join(m)
                located[key].append((row["rule"], m))
    later = summarize(after_e, weights(after), before.depth)
    return compare(before, later, located["rewrites"], located["refusals"])


def _print_modules(rows: list[dict], before_e, shown_ops: bool, *, every: bool) -> None:
    """The module table: with ``every`` (``--ops``) each module's rules by name, else their
    counts (the rules are in the grouped tables), which fits 80 columns."""
    from mlsys_jax.cli.per_module import text_rows
    from mlsys_jax.tables import format_table, wrap

    shown = text_rows(rows, by_rule=every)
    print(format_table(shown, title=f"\n[per module: {before_e.default_label} estimate before "
                                    "and after, rewrites, refusals]"))
    if not every:
        kernels = "" if shown_ops else \
            f"per-kernel tables ({len(before_e.default.kernels)} kernels before), "
        print(wrap(f"{kernels}each module's rules and every rewrite: --ops", first="  "))


def _print_rewrites(rewrites: list, refusals: list, *, every: bool) -> None:
    """The rewrites and refusals: every row with ``every`` (``--ops``), else one per rule (and
    check), ``rule ×count`` with the details that differ only in numbers merged
    (``cli.rewrite_rows``)."""
    from mlsys_jax.cli.rewrite_rows import grouped
    from mlsys_jax.tables import format_table

    text = lambda rows: [{k: v for k, v in r.items() if k != "module"} for r in rows]  # noqa: E731
    shown = text(rewrites) if every else grouped(rewrites, "detail")
    print(format_table(shown, title="\n[rewrites applied]"))
    if refusals:
        shown = text(refusals) if every else grouped(refusals, "reason", by=("rule", "check"))
        print(format_table(shown, title="\n[refused]"))


def _refuse_shapes(user) -> None:
    """optimize folds the parameters' values and checks both graphs on them: shapes have none."""
    from mlsys_jax.cli.shapes import refuse_values
    from mlsys_jax.ir.abstract import is_abstract

    if user.examples and user.args and is_abstract(user.args[0]):
        refuse_values("optimize", "it folds the parameters' values into the graph and checks "
                      "both graphs on them", fix="inspect costs a model on shapes")
