"""Experiment 05, sections 1–2 — per-op dispatch (seed 003): eager op-by-op time vs one jitted call
across tensor sizes, and a chain of N small ops (eager grows ≈ N × dispatch, jit stays flat)."""
from __future__ import annotations

import math

import jax
import numpy as np

from experiments._inputs import ramp
from mlsys_jax import timing

# --- 1. per-op dispatch vs tensor size -----------------------------------------------------

# Cheap ops (a multiply, an add): the arithmetic is ~free, so what is left is dispatch and
# memory traffic — the two costs seed 003 is about. (XLA does not reassociate float arithmetic,
# so the chain is not folded away under jit; x → x/2 + 1/2 stays bounded.) Eager mul and add
# executables are cached per shape and shared with relu(x*2+1)*0.5 below.
_CHAIN_OPS = (lambda x: x * 0.5, lambda x: x + 0.5)


def chain(x, n: int):
    """N elementwise ops, one after another (×0.5, +0.5, ×0.5, ...)."""
    for i in range(n):
        x = _CHAIN_OPS[i % len(_CHAIN_OPS)](x)
    return x


def dispatch_vs_size(sizes, k: int, repeats: int) -> dict:
    """Eager per-op time vs a jitted k-op chain's call time, at each tensor size.

    All sizes and both modes are timed in one interleaved comparison, so the ratios between sizes
    are paired round by round too (load on the shared machine cancels).
    """
    jitted = jax.jit(chain, static_argnums=1)
    xs = {n: ramp(n) for n in sizes}
    fns = {}
    for n, x in xs.items():
        fns[f"eager{n}"] = lambda x=x: chain(x, k)
        fns[f"jit{n}"] = lambda x=x: jitted(x, k)
    t = timing.compare(fns, repeats=repeats)
    small = t[f"eager{sizes[0]}"]
    rows = []
    for n in sizes:
        eager, jit = t[f"eager{n}"], t[f"jit{n}"]
        # §003: dispatch = the eager cost of an op whose arithmetic is ~free (the smallest tensor);
        # an op's own work = eager − dispatch; clamped at 0 (at small sizes it is timing noise).
        growth = timing.ratio(eager, small).median
        rows.append({"elements": n, "MB": 4 * n / 1e6,
                     "eager_us_per_op": eager.median_us / k, "jit_call_us": jit.median_us,
                     "jit_us_per_op": jit.median_us / k,
                     "eager/jit": timing.ratio(eager, jit).median,
                     "eager_op_vs_smallest": growth,
                     "dispatch_share": min(1.0, 1.0 / growth)})
    dispatch_us = rows[0]["eager_us_per_op"]
    # Compute hides dispatch where an op's own work equals its dispatch: eager op time = 2 × dispatch.
    crossover = _crossover(list(sizes), [r["eager_op_vs_smallest"] for r in rows], 2.0)
    return {"rows": rows, "summary": {
        "dispatch_us_per_op": dispatch_us, "jit_call_us": rows[0]["jit_call_us"],
        "chain_len": k, "crossover_elems": crossover,
        **_one_op_vs_one_call(xs[sizes[0]], k, repeats),
        "eager_over_jit_small": rows[0]["eager/jit"],
        "dispatch_share_small": rows[0]["dispatch_share"],
        "dispatch_share_large": rows[-1]["dispatch_share"]}}


def _one_op_vs_one_call(x, k: int, repeats: int) -> dict:
    """One eager op vs one jit call (of the same op, and of the whole k-op chain), on a tiny tensor.

    The margin is small on CPU (an eager op *is* a cached one-primitive executable plus the
    jnp/Python layer), so it gets its own measurement: three candidates, adjacent in every round,
    three times the rounds.
    """
    one = jax.jit(lambda x: x * 0.5)
    whole = jax.jit(chain, static_argnums=1)
    t = timing.compare({"eager_op": lambda: x * 0.5, "jit_op": lambda: one(x),
                        "jit_chain": lambda: whole(x, k)}, repeats=3 * repeats)
    return {"eager_op_us": t["eager_op"].median_us, "jit_op_call_us": t["jit_op"].median_us,
            "eager_op_over_jit_call": timing.ratio(t["eager_op"], t["jit_op"]).median,
            "eager_op_over_jit_chain_call": timing.ratio(t["eager_op"], t["jit_chain"]).median}


def _crossover(xs, ys, level: float) -> float | None:
    """First x where y reaches ``level``, interpolated linearly in log-log between samples."""
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if y0 < level <= y1:
            f = (math.log(level) - math.log(y0)) / (math.log(y1) - math.log(y0))
            return float(math.exp(math.log(x0) + f * (math.log(x1) - math.log(x0))))
    return None


# --- 2. a chain of N small ops: eager grows ≈ N × dispatch, jit stays flat -------------------

def chain_sweep(ns, size: int, repeats: int) -> dict:
    x = ramp(size)
    jitted = jax.jit(chain, static_argnums=1)
    fns = {}
    for n in ns:
        fns[f"eager{n}"] = lambda n=n: chain(x, n)
        fns[f"jit{n}"] = lambda n=n: jitted(x, n)
    t = timing.compare(fns, repeats=repeats)
    rows = [{"N": n, "eager_us": t[f"eager{n}"].median_us, "jit_us": t[f"jit{n}"].median_us,
             "eager_range_us": _range(t[f"eager{n}"]), "jit_range_us": _range(t[f"jit{n}"]),
             "eager/jit": timing.ratio(t[f"eager{n}"], t[f"jit{n}"]).median} for n in ns]
    eager_slope = theil_sen(ns, [r["eager_us"] for r in rows])
    jit_slope = theil_sen(ns, [r["jit_us"] for r in rows])
    return {"rows": rows, "summary": {"elements": size, "eager_slope_us_per_op": eager_slope,
                                      "jit_slope_us_per_op": jit_slope,
                                      "slope_ratio": eager_slope / max(jit_slope, 1e-3)}}


def _range(t: timing.Timing) -> str:
    return f"{t.min_s * 1e6:.3g}–{t.max_s * 1e6:.3g}"


def theil_sen(xs, ys) -> float:
    """Median of pairwise slopes: one noisy point on a shared machine cannot tilt the fit."""
    return float(np.median([(ys[j] - ys[i]) / (xs[j] - xs[i])
                            for i in range(len(xs)) for j in range(i + 1, len(xs))]))
