"""Sections 3–5 of experiment 05 and its plots: fusion (HLO kernels, cost-model bytes), seed
003's time breakdown, graph capture. Each section returns table rows and data."""
from __future__ import annotations

import math
import os
import re
from collections import Counter

import jax
import numpy as np
from jax import lax

from mlsys_jax import cost, ir, models, timing

# Seed 003's illustrative stacked bars (normalised time): compute / memory wait / dispatch.
SEED_BREAKDOWN = {"eager": {"compute": 40, "memory": 50, "dispatch": 30},
                  "optimized": {"compute": 40, "memory": 10, "dispatch": 2}}
LECTURE_FUSION_RATIO = 4  # seed 000 §6.1: relu(x*2+1)*0.5, "融合前后差 4 倍"


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


def f32(a) -> jax.Array:
    """A float32 device array from host data, cast on the host and transferred with device_put:
    a device-side cast (float64 → float32 under x64), and jnp.asarray itself in JAX 0.10, compile
    a program per shape (~0.1 s each on this shared machine)."""
    return jax.device_put(np.asarray(a, dtype=np.float32))


def ramp(n: int) -> jax.Array:
    """n float32 values evenly spaced in [0, 1] (host-built, like :func:`f32`)."""
    return f32(np.linspace(0.0, 1.0, n))


def _normal(rng, shape, scale=1.0):
    # NumPy draws, not jax.random: each jax.random shape compiles a program (1–4 s on this
    # shared 2-core machine), which would dominate a ~5 s experiment.
    return f32(rng.standard_normal(shape) * scale)


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
            "cost_model_kernels": f"{len(unfused.kernels)} → {len(fused.kernels)}"}


# --- 4. seed 003's time breakdown, and 5. graph capture, on a small model -------------------

def small_model(batch: int, sizes=(784, 100, 10)) -> dict:
    """The lecture's MNIST-shaped classifier (784→100→10 by default), one loss evaluation."""
    rng = np.random.default_rng(1)
    # The structure of models.mlp_init (scaled-normal W, zero b), drawn with NumPy (see _normal).
    params = {}
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        params[f"W{i}"] = _normal(rng, (n_in, n_out), 1 / math.sqrt(n_in))
        params[f"b{i}"] = f32(np.zeros(n_out))
    x = _normal(rng, (batch, sizes[0]))
    y = f32(np.eye(sizes[-1])[rng.integers(0, sizes[-1], batch)])
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
    """Write the PNGs; returns their paths ([] without matplotlib: see plots.unavailable_reason)."""
    from mlsys_jax.viz import plots

    if plots.unavailable_reason():
        return []
    rows, d = tables["dispatch_vs_size"], data["dispatch"]
    sizes = [r["elements"] for r in rows]
    written = [plots.lines(
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
    return [p for p in written if p]
