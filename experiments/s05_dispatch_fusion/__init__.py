"""Experiment 05 — the framework–hardware gap (seed 003): dispatch overhead, fusion, capture.

Eager JAX runs one op at a time: every op pays Python + dispatch before any arithmetic, and every
op reads and writes its tensors in memory. ``jax.jit`` captures the whole function, XLA fuses the
elementwise ops into one loop and the call pays dispatch once. Every time here is a ratio of
medians measured side by side in this run (mlsys_jax.timing); bytes come from the cost model.
"""
from __future__ import annotations

import math
import os

import jax

from experiments._inputs import small_model
from experiments.s05_dispatch_fusion.breakdown import SEED_BREAKDOWN, breakdown
from experiments.s05_dispatch_fusion.capture import capture_rows
from experiments.s05_dispatch_fusion.dispatch import chain_sweep, dispatch_vs_size
from experiments.s05_dispatch_fusion.fusion import FUSION_NOTES, LECTURE_FUSION_RATIO, fusion_rows
from mlsys_jax import runtime
from mlsys_jax.errors import MlsysError
from mlsys_jax.results import Check, Result, resolve_overrides
from mlsys_jax.viz import plots as viz

ID = "05"
TITLE = "Dispatch and fusion: the framework–hardware gap (seed 003)"
DEFAULTS = {
    "sizes": (10, 1_000, 100_000, 1_000_000),  # elements, dispatch-vs-size sweep
    "chain_len": 10,        # elementwise ops per chain in the size sweep
    "chain_ns": (1, 10, 50, 100),  # chain lengths N for the slope fit (10: shares a compile)
    "chain_size": 10,       # elements per tensor in the chain sweep (tiny: CPU-bound regime)
    "fusion_size": 1_000_000,  # elements for relu(x*2+1)*0.5
    "conv_shape": (8, 32, 32, 16),  # NHWC input of relu(conv(x, W) + b), 3x3 kernel, C→C
    "batch": 32,            # batch of the small model (MLP 784→100→10) in the breakdown
    "repeats": 7,           # timed rounds per measurement (median, min–max)
    "hw": "auto",           # cost-model hardware: auto = the device JAX measured
    "plots": "",            # directory for PNGs (needs the plot extra)
}


def run(**overrides) -> Result:
    cfg = resolve_overrides(ID, DEFAULTS, overrides)
    _validate(cfg)
    device = jax.devices()[0]
    hw = hardware_name(device) if cfg["hw"] == "auto" else cfg["hw"]
    notes = [f"measured on {device.platform} device '{device.device_kind}' "
             f"(jax {jax.__version__}); cost model hardware '{hw}'",
             "times are medians of repeated rounds after warm-up, candidates interleaved round "
             "by round; only ratios measured in this run are compared"]
    data: dict = {"device": {"platform": device.platform, "device_kind": device.device_kind,
                             "hw": hw}}
    tables: dict = {}
    reps = cfg["repeats"]

    sweep = dispatch_vs_size(cfg["sizes"], cfg["chain_len"], reps)
    tables["dispatch_vs_size"], data["dispatch"] = sweep["rows"], sweep["summary"]
    notes.append("dispatch_vs_size: dispatch = eager time per op on the smallest tensor (its "
                 "arithmetic is ~free); the crossover is the size where an eager op takes twice "
                 "that, i.e. where its own work equals its dispatch (interpolated in log-log)")
    if (sweep["summary"]["crossover_elems"] or 0) < 1e4 and device.platform == "cpu":
        notes.append("on this CPU an eager op's time already rises at ~1,000 elements, long "
                     "before its arithmetic matters (a 10-op jitted chain rises too), so the "
                     "crossover comes early; a likely cause (not verified here) is XLA:CPU "
                     "running only tiny kernels inline and handing larger ones to its thread "
                     "pool, which costs tens of µs on a busy 2-core machine")
    d = sweep["summary"]
    notes.append(f"small inputs: one eager op {d['eager_op_us']:.3g} µs vs one call of it jitted "
                 f"{d['jit_op_call_us']:.3g} µs ({d['eager_op_over_jit_call']:.2f}×; vs a whole "
                 f"{d['chain_len']}-op chain {d['eager_op_over_jit_chain_call']:.2f}×). Seed 003's "
                 "claim that the eager op takes longer holds by a small margin on a CPU (an eager "
                 "op is itself a cached one-primitive executable), so it is a benchmark figure, "
                 "not a check: `mlsys-jax bench dispatch`, eager_op_over_jit_call_ratio")
    if sweep["summary"]["crossover_elems"] is None:
        notes.append("no crossover inside the sizes swept: raise --set sizes=... to larger tensors")

    chains = chain_sweep(cfg["chain_ns"], cfg["chain_size"], reps)
    tables["chain"], data["chain"] = chains["rows"], chains["summary"]

    tables["fusion"], data["fusion"] = fusion_rows(cfg["fusion_size"], cfg["conv_shape"], hw, reps)
    notes += FUSION_NOTES

    small = small_model(cfg["batch"])
    bd = breakdown(small, hw, sweep["summary"], reps)
    tables["breakdown"], data["breakdown"] = bd["rows"], bd["summary"]
    notes.append("breakdown: compute and memory wait are the cost model's roofline terms "
                 f"(hardware '{hw}'), dispatch is measured (eager: ops × the per-op dispatch of the "
                 "size sweep; optimized: one jit call); 'measured_us' is the wall time of the same "
                 "step. On a CPU the step's working set sits in cache, so a DRAM-bandwidth model "
                 "overstates memory wait; the seed's bars are illustrative GPU figures")
    tables["capture"], cap_note = capture_rows(small, reps)
    data["capture"] = tables["capture"]
    notes.append(cap_note)

    result = Result(ID, TITLE, tables, notes, data)
    if cfg["plots"]:
        result.notes.extend(viz.plot_notes(plots(result, cfg["plots"])))
    return result


def hardware_name(device) -> str:
    """The cost model's hardware for the device JAX measured ('cpu' here; H100/H200/A100 on GPU)."""
    if device.platform == "cpu":
        return "cpu"
    kind = device.device_kind.lower()
    return next((name for name in ("h200", "h100", "a100") if name in kind), "h100")


def _validate(cfg: dict) -> None:
    sizes = list(cfg["sizes"])
    if len(sizes) < 2 or sizes != sorted(sizes) or sizes[0] < 1:
        raise MlsysError(f"experiment 05: sizes must be ≥ 2 increasing positive element counts, "
                         f"got {cfg['sizes']!r} (e.g. --set sizes=10,1000,100000)")
    if len(cfg["chain_ns"]) < 2 or min(cfg["chain_ns"]) < 1:
        raise MlsysError(f"experiment 05: chain_ns needs ≥ 2 chain lengths ≥ 1, got "
                         f"{cfg['chain_ns']!r} (e.g. --set chain_ns=1,50,100)")
    for key in ("chain_len", "chain_size", "fusion_size", "batch", "repeats"):
        if cfg[key] < 1:
            raise MlsysError(f"experiment 05: {key} must be ≥ 1, got {cfg[key]!r}")
    if len(cfg["conv_shape"]) != 4 or min(cfg["conv_shape"]) < 1:
        raise MlsysError(f"experiment 05: conv_shape is N,H,W,C (4 positive ints), got "
                         f"{cfg['conv_shape']!r} (e.g. --set conv_shape=8,32,32,16)")
    if cfg["plots"]:
        runtime.check_output_dir(cfg["plots"], "--set plots")
    # the largest swept tensor along a chain, the fusion and conv tensors (≈8 live copies each,
    # with the 3x3 kernel C·C·9) and the model's batch: 8 bytes per element, to be safe
    c = cfg["conv_shape"][3]
    values = (max(cfg["sizes"]) * (cfg["chain_len"] + 4) + max(cfg["chain_ns"]) * cfg["chain_size"]
              + 8 * (cfg["fusion_size"] + math.prod(cfg["conv_shape"])) + 9 * c * c
              + 8 * cfg["batch"] * (784 + 100 + 10))
    runtime.check_memory(8 * values, f"experiment 05 with sizes up to {max(cfg['sizes'])}, "
                         f"fusion_size={cfg['fusion_size']}, conv_shape={cfg['conv_shape']}",
                         "lower the sizes")


# --- claims ----------------------------------------------------------------------------------

def check(result: Result) -> list[Check]:
    d, ch = result.data["dispatch"], result.data["chain"]
    fu, bd = result.data["fusion"], result.data["breakdown"]
    # The timed claims below clear their thresholds by 3× or more on a quiet CPU (the unit test
    # says which it asserts, and why). One eager op vs one jit call, whose margin is small, is a
    # note of run() and a figure of `mlsys-jax bench dispatch` instead.
    checks = [
        Check("small inputs: eager per op ≥ 3× jit per op (dispatch-bound)",
              d["eager_over_jit_small"] >= 3.0, round(d["eager_over_jit_small"], 1), "CPU-bound"),
        Check("compute hides dispatch on large tensors: a crossover size exists in the sweep",
              d["crossover_elems"] is not None and d["dispatch_share_large"] < 0.5,
              f"crossover ≈ {d['crossover_elems'] or float('nan'):.3g} elements; dispatch share "
              f"{d['dispatch_share_small']:.2f} → {d['dispatch_share_large']:.2f}",
              "small ops: dispatch > compute"),
        Check("chain of N ops: eager slope ≥ 5× jit slope (eager ≈ N × dispatch, jit ≈ flat)",
              ch["slope_ratio"] >= 5.0,
              f"{ch['eager_slope_us_per_op']:.2f} vs {ch['jit_slope_us_per_op']:.3f} µs/op",
              "N × dispatch vs flat"),
    ]
    for row in fu:
        checks.append(Check(f"{row['function']}: fused HLO kernels < ops run one at a time",
                            row["hlo_kernels"] < row["ops"], f"{row['hlo_kernels']} vs {row['ops']}",
                            "one fused kernel"))
        if row.get("bytes_fused") is not None:
            checks.append(Check(f"{row['function']}: fusion moves fewer bytes (cost model)",
                                row["bytes_fused"] < row["bytes_unfused"],
                                f"{row['bytes_fused']:.3g} vs {row['bytes_unfused']:.3g} B",
                                "intermediates stay on chip"))
    ew = fu[0]
    checks.append(Check(f"{ew['function']}: op-by-op ≥ 1.5× slower than fused",
                        ew["eager/jit"] >= 1.5, round(ew["eager/jit"], 2), LECTURE_FUSION_RATIO,
                        note="the lecture measured torch on its machine; ours is JAX on this CPU"))
    checks.append(Check("breakdown: optimized execution has less dispatch and memory wait",
                        bd["opt_dispatch_us"] < bd["eager_dispatch_us"]
                        and bd["opt_memory_us"] <= bd["eager_memory_us"],
                        f"dispatch {bd['eager_dispatch_us']:.3g}→{bd['opt_dispatch_us']:.3g} µs, "
                        f"memory {bd['eager_memory_us']:.3g}→{bd['opt_memory_us']:.3g} µs",
                        "30→2, 50→10"))
    checks.append(Check("breakdown: measured eager step slower than the jitted step",
                        bd["measured_ratio"] > 1.0, round(bd["measured_ratio"], 2), 120 / 52,
                        note="seed 003's bars (40+50+30 vs 40+10+2) are illustrative; ours is "
                             "measured on this CPU"))
    for row in result.data["capture"]:
        if row["mode"] == "captured":
            checks.append(Check("graph capture: same loss as eager", row["matches_eager"], True, True))
    return checks


# --- plots -----------------------------------------------------------------------------------

def plots(result: Result, directory: str) -> list[str]:
    """The dispatch sweep, the chain slopes and the time breakdown as PNGs in ``directory``, drawn
    from ``result`` ([] without matplotlib: see viz.unavailable_reason)."""
    if viz.unavailable_reason():
        return []
    tables, data = result.tables, result.data
    rows, d = tables["dispatch_vs_size"], data["dispatch"]
    sizes = [r["elements"] for r in rows]
    written = [viz.lines(
        os.path.join(directory, "05_dispatch_vs_size.png"),
        {"eager, per op": (sizes, [r["eager_us_per_op"] for r in rows]),
         f"jit, {d['chain_len']}-op chain call / {d['chain_len']}":
             (sizes, [r["jit_us_per_op"] for r in rows])},
        xlabel="tensor size (float32 elements)", ylabel="time per op (µs)", log=True,
        title="Per-op time: eager dispatch vs one jitted call",
        hlines={f"eager dispatch ≈ {d['dispatch_us_per_op']:.1f} µs/op": d["dispatch_us_per_op"]},
        vlines=({f"crossover ≈ {d['crossover_elems']:.2g} elements": d["crossover_elems"]}
                if d["crossover_elems"] else {}))]
    ch = tables["chain"]
    written.append(viz.lines(
        os.path.join(directory, "05_chain.png"),
        {f"eager (slope {data['chain']['eager_slope_us_per_op']:.2f} µs/op)":
            ([r["N"] for r in ch], [r["eager_us"] for r in ch]),
         f"jit (slope {data['chain']['jit_slope_us_per_op']:.3f} µs/op)":
            ([r["N"] for r in ch], [r["jit_us"] for r in ch])},
        xlabel="ops in the chain N", ylabel="time per call (µs)",
        title=f"Chain of N elementwise ops on {data['chain']['elements']} elements"))
    # Ours (cost model + measured dispatch) beside seed 003's bars, each as % of its eager total.
    bd = {r["mode"]: r for r in tables["breakdown"]}
    ours_total = bd["eager"]["model_total_us"]
    seed_total = sum(SEED_BREAKDOWN["eager"].values())
    groups = ["eager (ours)", "optimized (ours)", "eager (seed 003)", "optimized (seed 003)"]
    parts = {"kernel compute": ("compute_us", "compute"), "memory wait": ("memory_wait_us", "memory"),
             "CPU dispatch": ("dispatch_us", "dispatch")}
    stacks = {label: [100 * bd[m][ours] / ours_total for m in ("eager", "optimized")]
              + [100 * SEED_BREAKDOWN[m][seed] / seed_total for m in ("eager", "optimized")]
              for label, (ours, seed) in parts.items()}
    measured = [100.0, bd["optimized"]["measured_%_of_eager"], None, None]
    written.append(viz.stacked_bars(
        os.path.join(directory, "05_breakdown.png"), groups, stacks,
        markers={"measured wall time (ours)": measured},
        ylabel="time (% of the eager total)",
        title=f"Time breakdown, {data['breakdown']['model']}"))
    return [p for p in written if p]
