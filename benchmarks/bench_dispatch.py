"""Dispatch and fusion (seed 003, experiment 05): eager op-by-op vs jit, measured side by side.

Every figure is a paired ratio from one interleaved comparison (median over rounds, min–max);
the chain slopes are µs per op with the machine as context (the runner records it).
"""
from __future__ import annotations

import jax

from experiments._inputs import ramp, small_model
from experiments.s05_dispatch_fusion.dispatch import chain, theil_sen
from experiments.s05_dispatch_fusion.fusion import elementwise
from mlsys_jax import timing
from mlsys_jax.execute import capture

NAME = "dispatch"


def run(quick: bool = False) -> dict:
    repeats = 5 if quick else 11
    ns = (1, 50) if quick else (1, 25, 50, 100)
    tiny, big = ramp(100), ramp(100_000 if quick else 1_000_000)
    one, whole = jax.jit(lambda x: x * 0.5), jax.jit(chain, static_argnums=1)
    fused = jax.jit(elementwise)
    fns = {"eager_op": lambda: tiny * 0.5, "jit_op": lambda: one(tiny),
           "eager_unfused": lambda: elementwise(big), "jit_fused": lambda: fused(big)}
    for n in ns:
        fns[f"eager_chain{n}"] = lambda n=n: chain(tiny, n)
        fns[f"jit_chain{n}"] = lambda n=n: whole(tiny, n)
    t = timing.compare(fns, repeats=repeats)
    slopes = {mode: theil_sen(ns, [t[f"{mode}_chain{n}"].median_us for n in ns])
              for mode in ("eager", "jit")}
    small = small_model(32)
    fn, args = small["fn"], small["args"]
    jitted = jax.jit(fn)
    captured = capture(fn)
    model = {"eager": lambda: fn(*args), "jit": lambda: jitted(*args),
             "captured": lambda: captured(*args)}
    notes = [f"tiny = {tiny.size} float32 elements; fusion on {big.size:,} elements; "
             f"model: {small['name']}; {repeats} rounds",
             "two lecture claims are figures here rather than experiment checks, their margin on "
             "a CPU being small: seed 003 'one eager op takes longer than one jit call' "
             "(eager_op_over_jit_call_ratio > 1) and seed 001 'the same model, eager vs jit' "
             "(model_eager_over_jit_ratio ≥ 2, experiment 06's execution_modes)"]
    tm = timing.compare(model, repeats=repeats)
    n = ns[-1]
    figures = {
        "eager_op_over_jit_call_ratio": timing.ratio(t["eager_op"], t["jit_op"]).to_dict(),
        f"eager_chain{n}_over_jit_chain{n}_ratio":
            timing.ratio(t[f"eager_chain{n}"], t[f"jit_chain{n}"]).to_dict(),
        "chain_slope_eager_over_jit_ratio": slopes["eager"] / max(slopes["jit"], 1e-3),
        "chain_slope_eager_us_per_op": slopes["eager"],
        "unfused_over_fused_elementwise_ratio":
            timing.ratio(t["eager_unfused"], t["jit_fused"]).to_dict(),
        "model_eager_over_jit_ratio": timing.ratio(tm["eager"], tm["jit"]).to_dict(),
        "model_eager_over_captured_ratio": timing.ratio(tm["eager"], tm["captured"]).to_dict(),
        "model_captured_over_jit_ratio": timing.ratio(tm["captured"], tm["jit"]).to_dict(),
    }
    return {"figures": figures, "notes": notes}
