"""Experiment 05 — the framework–hardware gap (seed 003): dispatch overhead, fusion, capture.

Eager JAX runs one op at a time: every op pays Python + dispatch before any arithmetic, and every
op reads and writes its tensors in memory. ``jax.jit`` captures the whole function, XLA fuses the
elementwise ops into one loop and the call pays dispatch once. Every time here is a ratio of
medians measured side by side in this run (mlsys_jax.timing); bytes come from the cost model.
"""
from __future__ import annotations

import math
import os
import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax import cost, ir, models, runtime, timing
from mlsys_jax.errors import MlsysError
from mlsys_jax.report import Check, Result, format_result, resolve_overrides

ID = "05"
TITLE = "Dispatch and fusion: the framework–hardware gap (seed 003)"
DEFAULTS = {
    "sizes": (10, 1_000, 100_000, 1_000_000),  # elements, dispatch-vs-size sweep
    "chain_len": 10,        # elementwise ops per chain in the size sweep
    "chain_ns": (1, 25, 50, 100),  # chain lengths N for the slope fit
    "chain_size": 10,       # elements per tensor in the chain sweep (tiny: CPU-bound regime)
    "fusion_size": 1_000_000,  # elements for relu(x*2+1)*0.5
    "conv_shape": (8, 32, 32, 16),  # NHWC input of relu(conv(x, W) + b), 3x3 kernel, C→C
    "batch": 32,            # batch of the small model (MLP 784→100→10) in the breakdown
    "repeats": 7,           # timed rounds per measurement (median, min–max)
    "hw": "auto",           # cost-model hardware: auto = the device JAX measured
    "plots": "",            # directory for PNGs (needs the plot extra)
}
# Seed 003's illustrative stacked bars (normalised time): compute / memory wait / dispatch.
SEED_BREAKDOWN = {"eager": {"compute": 40, "memory": 50, "dispatch": 30},
                  "optimized": {"compute": 40, "memory": 10, "dispatch": 2}}
LECTURE_FUSION_RATIO = 4  # seed 000 §6.1: relu(x*2+1)*0.5, "融合前后差 4 倍"


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
    if sweep["summary"]["crossover_elems"] is None:
        notes.append("no crossover inside the sizes swept: raise --set sizes=... to larger tensors")

    chain = chain_sweep(cfg["chain_ns"], cfg["chain_size"], reps)
    tables["chain"], data["chain"] = chain["rows"], chain["summary"]

    tables["fusion"], data["fusion"] = fusion_rows(cfg["fusion_size"], cfg["conv_shape"],
                                                         hw, reps)
    notes += FUSION_NOTES

    small = small_model(cfg["batch"])
    bd = breakdown(small, hw, sweep["summary"], reps)
    tables["breakdown"], data["breakdown"] = bd["rows"], bd["summary"]
    notes.append("breakdown: compute and memory wait are the cost model's roofline terms "
                 f"(hardware '{hw}'), dispatch is measured (eager: ops × the per-op dispatch of the "
                 "size sweep; optimized: one jit call); 'measured_us' is the wall time of the same "
                 "step. On a CPU the step's working set sits in cache, so a DRAM-bandwidth model "
                 "overstates memory wait; the seed's bars are illustrative GPU figures")
    cap_rows, cap_note = capture_rows(small, reps)
    if cap_rows:
        tables["capture"] = cap_rows
    data["capture"] = cap_rows
    notes.append(cap_note)

    if cfg["plots"]:
        notes += write_plots(cfg["plots"], tables, data)
    return Result(ID, TITLE, tables, notes, data)


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
    xs = {n: jnp.linspace(0.0, 1.0, n, dtype=jnp.float32) for n in sizes}
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
    x = jnp.linspace(0.0, 1.0, size, dtype=jnp.float32)
    jitted = jax.jit(chain, static_argnums=1)
    fns = {}
    for n in ns:
        fns[f"eager{n}"] = lambda n=n: chain(x, n)
        fns[f"jit{n}"] = lambda n=n: jitted(x, n)
    t = timing.compare(fns, repeats=repeats)
    rows = [{"N": n, "eager_us": t[f"eager{n}"].median_us, "jit_us": t[f"jit{n}"].median_us,
             "eager_range_us": _range(t[f"eager{n}"]), "jit_range_us": _range(t[f"jit{n}"]),
             "eager/jit": timing.ratio(t[f"eager{n}"], t[f"jit{n}"]).median} for n in ns]
    eager_slope = _theil_sen(ns, [r["eager_us"] for r in rows])
    jit_slope = _theil_sen(ns, [r["jit_us"] for r in rows])
    return {"rows": rows, "summary": {"elements": size, "eager_slope_us_per_op": eager_slope,
                                      "jit_slope_us_per_op": jit_slope,
                                      "slope_ratio": eager_slope / max(jit_slope, 1e-3)}}


def _range(t: timing.Timing) -> str:
    return f"{t.min_s * 1e6:.3g}–{t.max_s * 1e6:.3g}"


def _theil_sen(xs, ys) -> float:
    """Median of pairwise slopes: one noisy point on a shared machine cannot tilt the fit."""
    return float(np.median([(ys[j] - ys[i]) / (xs[j] - xs[i])
                            for i in range(len(xs)) for j in range(i + 1, len(xs))]))


# --- 3. fusion: kernels in the compiled HLO vs ops run one at a time --------------------------

def elementwise(x):
    """Seed 000 §6.1's relu(x*2+1)*0.5: four elementwise ops."""
    return jax.nn.relu(x * 2.0 + 1.0) * 0.5


def conv_bias_relu(x, w, b):
    """Seed 003's y = ReLU(Conv(x, W) + b), NHWC (XLA:CPU's native layout: no transposes)."""
    y = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.nn.relu(y + b)


_NOT_KERNELS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast"}
_HLO_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?:\([^=]*?\)|\S+)\s+([\w\-]+)\(")


def hlo_kernels(hlo_text: str) -> Counter:
    """Opcodes of the compiled module's entry computation that run as kernels (fusion, conv, ...)."""
    counts: Counter = Counter()
    in_entry = False
    for line in hlo_text.splitlines():
        if line.startswith("ENTRY"):
            in_entry = True
        elif in_entry and line.startswith("}"):
            break
        elif in_entry and (m := _HLO_INSTR.match(line)) and m.group(1) not in _NOT_KERNELS:
            counts[m.group(1)] += 1
    return counts


FUSION_NOTES = [
    "fusion: 'ops' is the op view (what eager JAX dispatches one at a time, each reading and "
    "writing memory); 'hlo_kernels' counts the instructions of XLA's compiled entry computation "
    "(a loop fusion or a convolution each is one kernel)",
    "XLA:CPU fuses the bias add and ReLU into one loop after the convolution (the convolution "
    "itself stays a library call); on GPU, XLA may also fold them into the cuDNN call",
]


def _normal(rng, shape, scale=1.0):
    # NumPy draws, not jax.random: each jax.random shape compiles a program (1–4 s on this
    # shared 2-core machine), which would dominate a ~5 s experiment.
    return jnp.asarray(rng.standard_normal(shape) * scale, dtype=jnp.float32)


def fusion_rows(size: int, conv_shape, hw: str, repeats: int):
    rng = np.random.default_rng(0)
    x = _normal(rng, (size,))
    n, h, w_, c = conv_shape
    cx, cb = _normal(rng, (n, h, w_, c)), _normal(rng, (c,))
    cw = _normal(rng, (3, 3, c, c), 1 / (3 * math.sqrt(c)))
    cases = [(f"relu(x*2+1)*0.5 on {size:,} elements", elementwise, (x,)),
             (f"relu(conv(x,W)+b), x {tuple(conv_shape)} NHWC, W 3x3", conv_bias_relu, (cx, cw, cb))]
    rows = []
    for name, fn, args in cases:
        closed = jax.make_jaxpr(fn)(*args)
        compiled = jax.jit(fn).lower(*args).compile()  # timed below too: one compile, not two
        kernels = hlo_kernels(compiled.as_text())
        t = timing.compare({"eager": lambda: fn(*args), "jit": lambda: compiled(*args)},
                           repeats=repeats)
        ops = ir.op_view(closed)
        row = {"function": name, "ops": len(ops), "op_names": " ".join(o.name for o in ops),
               "hlo_kernels": sum(kernels.values()),
               "hlo_opcodes": " ".join(f"{k}×{v}" for k, v in sorted(kernels.items())),
               **_bytes(closed, hw),
               "eager_us": t["eager"].median_us, "jit_us": t["jit"].median_us,
               "eager/jit": timing.ratio(t["eager"], t["jit"]).median,
               "lecture_ratio": LECTURE_FUSION_RATIO if fn is elementwise else None}
        rows.append(row)
    return rows, rows  # the table is the data


def _bytes(closed, hw: str) -> dict:
    unfused = cost.estimate(closed, hw=hw, fused=False)
    fused = cost.estimate(closed, hw=hw, fused=True)
    return {"bytes_unfused": unfused.total_bytes, "bytes_fused": fused.total_bytes,
            "model_kernels_unfused": len(unfused.kernels), "model_kernels_fused": len(fused.kernels)}


# --- 4. seed 003's time breakdown, and 5. graph capture, on a small model -------------------

def small_model(batch: int, sizes=(784, 100, 10)) -> dict:
    """The lecture's MNIST-shaped classifier (784→100→10 by default), one loss evaluation."""
    rng = np.random.default_rng(1)
    # The structure of models.mlp_init (scaled-normal W, zero b), drawn with NumPy (see _normal).
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"W{i}"] = _normal(rng, (n_in, n_out), 1 / math.sqrt(n_in))
        params[f"b{i}"] = jnp.zeros((n_out,), jnp.float32)
    x = _normal(rng, (batch, sizes[0]))
    y = jnp.asarray(np.eye(sizes[-1])[rng.integers(0, sizes[-1], batch)], dtype=jnp.float32)
    return {"name": f"MLP {'→'.join(map(str, sizes))} loss, batch {batch}", "fn": models.mlp_loss,
            "args": (params, x, y), "jit": jax.jit(models.mlp_loss)}


def breakdown(small: dict, hw: str, dispatch: dict, repeats: int) -> dict:
    """Compute and memory wait from the cost model, dispatch from the measured per-op overhead."""
    fn, args = small["fn"], small["args"]
    closed = jax.make_jaxpr(fn)(*args)
    spec = cost.get_hardware(hw)
    jitted = small["jit"]
    t = timing.compare({"eager": lambda: fn(*args), "jit": lambda: jitted(*args)}, repeats=repeats)
    n_ops = len(ir.op_view(closed))
    modes = {"eager": (cost.estimate(closed, hw=hw, fused=False), n_ops * dispatch["dispatch_us_per_op"],
                       t["eager"].median_us),
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
                     "compute_%": 100 * compute / total, "memory_%": 100 * memory / total,
                     "dispatch_%": 100 * dispatch_us / total,
                     "seed_compute/memory/dispatch": f"{seed['compute']}/{seed['memory']}/{seed['dispatch']}",
                     "seed_total_%_of_eager": round(100 * sum(seed.values()) / seed_total)})
        summary[f"{'opt' if mode == 'optimized' else mode}_dispatch_us"] = dispatch_us
        summary[f"{'opt' if mode == 'optimized' else mode}_memory_us"] = memory
    summary["measured_ratio"] = timing.ratio(t["eager"], t["jit"]).median
    summary["model"] = small["name"]
    return {"rows": rows, "summary": summary}


def capture_rows(small: dict, repeats: int):
    """The same model under issue 4's graph capture, beside eager and jit (skipped if absent)."""
    try:
        from mlsys_jax import capture
    except (ImportError, AttributeError) as e:
        return None, ("graph capture skipped: mlsys_jax.capture (issue 4, graph-break capture) is "
                      f"not in this checkout yet ({type(e).__name__}: {e})")
    fn, args = small["fn"], small["args"]
    captured, jitted = capture(fn), small["jit"]
    eager_out = fn(*args)
    t = timing.compare({"eager": lambda: fn(*args), "captured": lambda: captured(*args),
                        "jit": lambda: jitted(*args)}, repeats=repeats)
    rows = [{"mode": mode, "us": t[mode].median_us,
             "speedup_vs_eager": timing.ratio(t["eager"], t[mode]).median,
             "matches_eager": bool(np.allclose(np.asarray(out), np.asarray(eager_out),
                                               rtol=1e-6, atol=0))}
            for mode, out in (("eager", eager_out), ("captured", captured(*args)),
                              ("jit", jitted(*args)))]
    return rows, (f"graph capture ({small['name']}): warm captured calls replay the recorded "
                  "graph without re-running Python op by op")


# --- plots -----------------------------------------------------------------------------------

def write_plots(directory: str, tables: dict, data: dict) -> list[str]:
    from mlsys_jax.viz import plots

    reason = plots.unavailable_reason()
    if reason:
        return [reason]
    rows, d = tables["dispatch_vs_size"], data["dispatch"]
    sizes = [r["elements"] for r in rows]
    written = [plots.lines(
        os.path.join(directory, "05_dispatch_vs_size.png"),
        {"eager, per op": (sizes, [r["eager_us_per_op"] for r in rows]),
         f"jit, {d['chain_len']}-op chain call / {d['chain_len']}": (sizes, [r["jit_us_per_op"] for r in rows])},
        xlabel="tensor size (float32 elements)", ylabel="time per op (µs)", log=True,
        title="Per-op time: eager dispatch vs one jitted call",
        hlines={f"eager dispatch ≈ {d['dispatch_us_per_op']:.1f} µs/op": d["dispatch_us_per_op"]},
        vlines=({f"crossover ≈ {d['crossover_elems']:.2g} elements": d["crossover_elems"]}
                if d["crossover_elems"] else {}))]
    ch = tables["chain"]
    written.append(plots.lines(
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
    written.append(plots.stacked_bars(
        os.path.join(directory, "05_breakdown.png"), groups, stacks,
        markers={"measured wall time (ours)": measured},
        ylabel="time (% of the eager total)",
        title=f"Time breakdown, {data['breakdown']['model']}"))
    return [f"plot written: {p}" for p in written if p]


# --- claims ----------------------------------------------------------------------------------

def check(result: Result) -> list[Check]:
    d, ch = result.data["dispatch"], result.data["chain"]
    fu, bd = result.data["fusion"], result.data["breakdown"]
    checks = [
        Check("small inputs: one eager op takes longer than one call of a jitted function",
              d["eager_op_over_jit_call"] > 1.0,
              f"{d['eager_op_us']:.3g} vs {d['jit_op_call_us']:.3g} µs "
              f"({d['eager_op_over_jit_call']:.2f}×; vs a whole {d['chain_len']}-op chain "
              f"{d['eager_op_over_jit_chain_call']:.2f}×)", "per-op dispatch > one call"),
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
                        ew["eager/jit"] >= 1.5, round(ew["eager/jit"], 2), LECTURE_FUSION_RATIO))
    checks.append(Check("breakdown: optimized execution has less dispatch and memory wait",
                        bd["opt_dispatch_us"] < bd["eager_dispatch_us"]
                        and bd["opt_memory_us"] <= bd["eager_memory_us"],
                        f"dispatch {bd['eager_dispatch_us']:.3g}→{bd['opt_dispatch_us']:.3g} µs, "
                        f"memory {bd['eager_memory_us']:.3g}→{bd['opt_memory_us']:.3g} µs",
                        "30→2, 50→10"))
    checks.append(Check("breakdown: measured eager step slower than the jitted step",
                        bd["measured_ratio"] > 1.0, round(bd["measured_ratio"], 2), 120 / 52))
    for row in result.data["capture"] or ():
        if row["mode"] == "captured":
            checks.append(Check("graph capture: same loss as eager", row["matches_eager"], True, True))
    return checks


def main() -> None:
    result = run()
    print(format_result(result, check(result)))


if __name__ == "__main__":
    runtime.configure()
    main()
