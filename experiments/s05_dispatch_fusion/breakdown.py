"""Experiment 05, section 4 — seed 003's time breakdown of one step of the small model: compute and
memory wait from the roofline cost model, dispatch measured (eager: per op; jit: one call)."""
from __future__ import annotations

import jax

from mlsys_jax import cost, ir, timing

# Seed 003's illustrative stacked bars (normalised time): compute / memory wait / dispatch.
SEED_BREAKDOWN = {"eager": {"compute": 40, "memory": 50, "dispatch": 30},
                  "optimized": {"compute": 40, "memory": 10, "dispatch": 2}}


def breakdown(small: dict, hw: str, dispatch: dict, repeats: int) -> dict:
    """Compute and memory wait from the cost model, dispatch from the measured per-op overhead."""
    fn, args = small["fn"], small["args"]
    closed = jax.make_jaxpr(fn)(*args)
    spec = cost.get_hardware(hw)
    jitted = small["jit"]
    t = timing.compare({"eager": lambda: fn(*args), "jit": lambda: jitted(*args)}, repeats=repeats)
    n_ops = len(ir.op_view(closed))
    modes = {"eager": (cost.estimate(closed, hw=hw, fused=False),
                       n_ops * dispatch["dispatch_us_per_op"], t["eager"].median_us),
             "optimized": (cost.estimate(closed, hw=hw, fused=True), dispatch["jit_call_us"],
                           t["jit"].median_us)}
    rows, summary = [], {}
    for mode, (report, dispatch_us, measured_us) in modes.items():
        # §003 roofline per kernel: compute time, plus the memory time compute does not hide.
        compute = sum(k.flops / spec.peak(k.dtype) for k in report.kernels) * 1e6
        memory = sum(max(0.0, k.bytes / spec.bandwidth - k.flops / spec.peak(k.dtype))
                     for k in report.kernels) * 1e6
        total = compute + memory + dispatch_us
        seed = SEED_BREAKDOWN[mode]
        seed_total = sum(SEED_BREAKDOWN["eager"].values())
        rows.append({"mode": mode, "kernels": len(report.kernels),
                     "compute_us": compute, "memory_wait_us": memory, "dispatch_us": dispatch_us,
                     "model_total_us": total, "measured_us": measured_us,
                     "measured_%_of_eager": 100 * measured_us / t["eager"].median_us,
                     "compute/memory/dispatch_%": "/".join(
                         f"{100 * v / total:.0f}" for v in (compute, memory, dispatch_us)),
                     "seed_compute/memory/dispatch":
                         f"{seed['compute']}/{seed['memory']}/{seed['dispatch']}",
                     "seed_total_%_of_eager": round(100 * sum(seed.values()) / seed_total)})
        summary[f"{'opt' if mode == 'optimized' else mode}_dispatch_us"] = dispatch_us
        summary[f"{'opt' if mode == 'optimized' else mode}_memory_us"] = memory
    summary["measured_ratio"] = timing.ratio(t["eager"], t["jit"]).median
    summary["model"] = small["name"]
    return {"rows": rows, "summary": summary}
