"""``mlsys-jax optimize FILE.py:FN --arg SPEC ... [--passes LIST] [--search [--budget N] [--alpha A]] [--json]``.

Applies verified passes (or the TASO-style search, which starts from the default pipeline's result
and so never loses to it) to a user's function and prints the op tables before and after, the
rewrites applied (and refused, with reasons), the verification result and the largest output
difference on seeded random inputs.
"""
from __future__ import annotations

import json

from mlsys_jax.cli import target
from mlsys_jax.errors import MlsysError

HELP = "apply verified rewrite passes to a function"
SEARCH_BUDGET = 100  # graphs; after the pipeline's result the moves are few, so it rarely binds
SEARCH_MEASURED = 4  # with --search --measure: graphs timed beside the original


def add_arguments(p) -> None:
    target.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--passes", default=None,
                   help="comma-separated passes (default: the standard pipeline)")
    p.add_argument("--search", action="store_true", help="cost-based search over rewrites")
    p.add_argument("--alpha", type=float, default=None,
                   help="search: keep graphs costing < alpha × the best (default 1.05; 1 = greedy)")
    p.add_argument("--budget", type=int, default=None, metavar="N",
                   help=f"search: at most N graphs explored (default {SEARCH_BUDGET})")


def max_abs_diff(before, after, structs) -> float:
    """Largest |difference| between the two jaxprs' outputs on seeded random inputs."""
    import jax
    import jax.numpy as jnp

    from mlsys_jax.ir import interpret, random_inputs

    args = random_inputs(structs, seed=0)
    outs = jax.jit(lambda *a: (interpret(before, *a), interpret(after, *a)))(*args)
    worst = 0.0
    for a, b in zip(*outs):
        if jnp.issubdtype(a.dtype, jnp.inexact):
            worst = max(worst, float(jnp.max(jnp.abs(a.astype(jnp.float64) - b.astype(jnp.float64)),
                                             initial=0.0)))
        elif not bool(jnp.array_equal(a, b)):
            worst = float("inf")
    return worst


def _summary(report) -> dict:
    return {**report.totals(), "primitives": dict(report.primitives)}


def main(args) -> int:
    from mlsys_jax import passes as P
    from mlsys_jax.cost import estimate
    from mlsys_jax.passes.registry import pipeline as named_pipeline
    from mlsys_jax.passes.search import search
    from mlsys_jax.tables import format_table, wrap

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
    pipeline = None if args.search else named_pipeline(args.passes, source="--passes")
    searched = None
    user = target.resolve(args)
    closed = user.trace()
    try:
        if args.search:
            measure = SEARCH_MEASURED if getattr(args, "measure", False) else 0
            found = search(closed, alpha=alpha, hw=args.hw, dtype=args.dtype, budget=budget,
                           measure=measure)
            after, logged = found.best, found
            searched = {"path": found.path_rows(), "explored": found.explored,
                        "budget": budget, "alpha": alpha, "seconds": found.seconds,
                        "measured": found.measured}
        else:
            logged = P.run(pipeline, closed, verify=True, hw=args.hw, dtype=args.dtype)
            after = logged.jaxpr
        rewrites = [{"rule": r.rule, "where": r.where, "detail": r.detail}
                    for r in logged.rewrites]
        refusals = [{"rule": r.rule, "where": r.where, "reason": r.reason}
                    for r in logged.refusals]
        verified, failure = True, ""
    except P.VerificationError as e:  # a pass bug, not a user error: report it, exit 1
        after, rewrites, refusals, verified, failure = closed, [], [], False, str(e)
    before_r = estimate(closed, hw=args.hw, dtype=args.dtype)
    after_r = estimate(after, hw=args.hw, dtype=args.dtype)
    diff = max_abs_diff(closed, after, user.args)
    if args.json:
        print(json.dumps({"before": _summary(before_r), "after": _summary(after_r),
                          "rewrites": rewrites, "refusals": refusals, "max_abs_diff": diff,
                          "verified": verified, "error": failure,
                          **({"search": searched} if searched else {})}, indent=1))
        return 0 if verified else 1
    for label, rep in (("before", before_r), ("after", after_r)):
        rows = [{k: r[k] for k in ("name", "in", "out", "flops", "bytes", "time_us")}
                for r in rep.rows()]
        t = rep.totals()
        print(format_table(rows, title=f"\n[{label}: {t['kernels']} kernels, "
                                       f"{t['flops'] / 1e9:.4g} GFLOP, {t['time_us']:.4g} µs "
                                       f"on {rep.hardware.name}, {args.dtype or 'native dtypes'}]"))
    if searched:
        print(format_table(searched["path"], title=f"\n[search path: {searched['explored']} of "
                                                    f"at most {budget} graphs explored, "
                                                    f"α={alpha}, {searched['seconds']:.2f} s]"))
    print(format_table(rewrites, title="\n[rewrites applied]"))
    if refusals:
        print(format_table(refusals, title="\n[refused]"))
    print("\n" + wrap(f"verified: {'yes' if verified else 'NO — ' + failure}; max |output diff| "
                      f"on seeded random inputs: {diff:.3g}", first=""))
    return 0 if verified else 1
