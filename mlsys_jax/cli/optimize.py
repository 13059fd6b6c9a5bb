"""``mlsys-jax optimize FILE.py:FN --arg SPEC ... [--passes LIST] [--search] [--alpha A] [--json]``.

Applies verified passes (or the TASO-style search) to a user's function and prints the op tables
before and after, the rewrites applied (and refused, with reasons), the verification result and
the largest output difference on seeded random inputs.
"""
from __future__ import annotations

import json

from mlsys_jax.cli import target
from mlsys_jax.cli.limits import check_evaluation_fits
from mlsys_jax.errors import MlsysError

HELP = "apply verified rewrite passes to a function"


def add_arguments(p) -> None:
    target.add_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--passes", default=None,
                   help="comma-separated passes (default: the standard pipeline)")
    p.add_argument("--search", action="store_true", help="cost-based search over rewrites")
    p.add_argument("--alpha", type=float, default=1.05, help="search slack (default 1.05)")


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
    if args.search and not args.alpha >= 1.0:
        raise MlsysError(f"--alpha must be ≥ 1.0 (1.0 = greedy), got {args.alpha}")
    pipeline = None if args.search else named_pipeline(args.passes, source="--passes")
    user = target.resolve(args)
    closed = user.trace()
    check_evaluation_fits(closed, f"optimize's check of {user.name} on random inputs")
    try:
        if args.search:
            found = search(closed, alpha=args.alpha, hw=args.hw, dtype=args.dtype)
            after = found.best
            rewrites = [{"rule": s.rule, "where": "", "detail": s.detail, "time_us": s.time_us,
                         "kernels": s.kernels} for s in found.path]
            refusals = []
        else:
            res = P.run(pipeline, closed, verify=True, hw=args.hw, dtype=args.dtype)
            after = res.jaxpr
            rewrites = [{"rule": r.rule, "where": r.where, "detail": r.detail} for r in res.rewrites]
            refusals = [{"rule": r.rule, "where": r.where, "reason": r.reason} for r in res.refusals]
        verified, failure = True, ""
    except P.VerificationError as e:  # a pass bug, not a user error: report it, exit 1
        after, rewrites, refusals, verified, failure = closed, [], [], False, str(e)
    before_r = estimate(closed, hw=args.hw, dtype=args.dtype)
    after_r = estimate(after, hw=args.hw, dtype=args.dtype)
    diff = max_abs_diff(closed, after, user.args)
    if args.json:
        print(json.dumps({"before": _summary(before_r), "after": _summary(after_r),
                          "rewrites": rewrites, "refusals": refusals, "max_abs_diff": diff,
                          "verified": verified, "error": failure}, indent=1))
        return 0 if verified else 1
    for label, rep in (("before", before_r), ("after", after_r)):
        rows = [{k: r[k] for k in ("name", "in", "out", "flops", "bytes", "time_us")}
                for r in rep.rows()]
        t = rep.totals()
        print(format_table(rows, title=f"\n[{label}: {t['kernels']} kernels, "
                                       f"{t['flops'] / 1e9:.4g} GFLOP, {t['time_us']:.4g} µs "
                                       f"on {rep.hardware.name}, {args.dtype or 'native dtypes'}]"))
    print(format_table(rewrites, title="\n[rewrites applied]"))
    if refusals:
        print(format_table(refusals, title="\n[refused]"))
    print("\n" + wrap(f"verified: {'yes' if verified else 'NO — ' + failure}; max |output diff| "
                      f"on seeded random inputs: {diff:.3g}", first=""))
    return 0 if verified else 1
