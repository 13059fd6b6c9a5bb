"""Experiment 06 — the frameworks chapter (seed 001) in JAX: AD modes, graphs, JIT, vmap.

The chapter's worked examples are recomputed with ``jax.jvp`` (forward mode) and ``jax.vjp``
(reverse mode), step by step; forward vs reverse cost is measured with ``jacfwd``/``jacrev``;
static vs dynamic graphs are counted as traces; compile-once-run-many and execution modes are
timed side by side in one run (mlsys_jax.timing: paired medians of interleaved rounds).
"""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import experiments
from experiments import _s06_parts as parts
from experiments._s05_parts import f32
from mlsys_jax import runtime
from mlsys_jax.errors import MlsysError
from mlsys_jax.report import Check, Result, resolve_overrides

ID = "06"
TITLE = "Frameworks: forward vs reverse AD, static vs dynamic graphs, JIT (seed 001)"
# The chapter's worked examples (fixed: the checks compare with its printed numbers).
X0 = 2.0                   # f(x) = x²·sin(x) at x = 2 (listings 3, 5, 9, 10)
NETWORK = (1.0, 2.0, 3.0)  # the small network's x, w1, w2 (listings 11–13)
DEFAULTS = {
    "jac_big": 512,          # the large side of f: R^n → R^m in the jacfwd/jacrev sweep
    "jac_small": (1, 512),   # the other side: rows (big, s) and (s, big) for each s
    "jac_hidden": 64,        # f(x) = W2 tanh(W1 x) with this hidden width
    "hvp_n": 200,            # parameters of the Hessian-vector-product example
    "batch": 32,             # examples for vmap per-example gradients vs a Python loop
    "repeats": 7,            # timed rounds per measurement (median, min–max)
}


def run(**overrides) -> Result:
    cfg = resolve_overrides(ID, DEFAULTS, overrides)
    _validate(cfg)
    runtime.enable_x64()  # the worked numbers are checked in float64
    device = jax.devices()[0]
    notes = [f"measured on {device.platform} device '{device.device_kind}' (jax {jax.__version__})",
             "times are medians of interleaved rounds after warm-up; ratios are paired per round"]
    tables, data = {}, {"device": {"platform": device.platform, "device_kind": device.device_kind}}

    fwd, rev, worked = parts.worked_example(X0)
    tables["forward_mode"], tables["reverse_mode"], data["worked"] = fwd, rev, worked
    notes.append(parts.slip_note(worked))
    tables["small_network"], data["network"] = parts.small_network(*NETWORK)

    pairs = [(cfg["jac_big"], s) for s in cfg["jac_small"]]
    pairs += [(s, cfg["jac_big"]) for s in cfg["jac_small"] if s != cfg["jac_big"]]
    tables["jacfwd_vs_jacrev"], data["jac"] = parts.jacobian_sweep(
        sorted(set(pairs), key=lambda p: p[0] / p[1], reverse=True), cfg["jac_hidden"],
        cfg["repeats"])
    notes.append(parts.JAC_NOTE + f"; the winner changes {data['jac']['crossover']}")

    tables["higher_order"], data["higher"] = parts.higher_order(X0, cfg["hvp_n"], cfg["repeats"])
    tables["per_example_grads"], data["vmap"] = parts.per_example(cfg["batch"], cfg["repeats"])
    tables["traces"], data["traces"] = trace_counts()
    (tables["compile_once_run_many"], data["compile"], tables["execution_modes"],
     data["modes"]) = parts.compile_once(cfg["batch"], cfg["repeats"])
    notes.append(f"compile_once_run_many and execution_modes: {data['compile']['model']}")
    notes += parts.MISCONCEPTION_NOTES
    return Result(ID, TITLE, tables, notes, data)


def _validate(cfg: dict) -> None:
    for key in ("jac_big", "jac_hidden", "hvp_n", "batch", "repeats"):
        if cfg[key] < 1:
            raise MlsysError(f"experiment 06: {key} must be ≥ 1, got {cfg[key]!r}")
    if not cfg["jac_small"] or min(cfg["jac_small"]) < 1:
        raise MlsysError(f"experiment 06: jac_small needs sizes ≥ 1, got {cfg['jac_small']!r} "
                         "(e.g. --set jac_small=1,16,256)")


# --- static vs dynamic graphs: count traces --------------------------------------------------

def trace_counts() -> tuple[list[dict], dict]:
    """Seed 001 static vs dynamic graphs, as JAX sees them: a trace is one graph built.

    A Python ``if`` on a *static* argument picks the graph at trace time: one graph per branch
    taken. ``lax.cond`` puts both branches in one graph (TF's Switch/Merge). A new input shape
    is a new graph. A Python ``if`` on a traced value has no value to branch on: an error.
    """
    traces: Counter = Counter()
    x3 = f32(np.arange(3))

    def python_if(x, mode):
        traces["python_if"] += 1
        return x * x if mode == "square" else jnp.sin(x)

    def with_cond(x, square):
        traces["cond"] += 1
        return lax.cond(square, lambda v: v * v, jnp.sin, x)

    def plain(x):
        traces["shapes"] += 1
        return jnp.sin(x) * 2.0

    modes = ["square", "sin", "square", "sin"]
    jit_if = jax.jit(python_if, static_argnames="mode")
    for m in modes:
        jit_if(x3, mode=m)
    flags = [True, False, True, False]
    jit_cond = jax.jit(with_cond)
    same = [np.array_equal(jit_cond(x3, f), jit_if(x3, mode="square" if f else "sin"))
            for f in flags]
    lengths = [3, 4, 3]
    jit_plain = jax.jit(plain)
    for n in lengths:
        jit_plain(f32(np.arange(n)))
    try:
        jax.jit(lambda x: x if x.sum() > 0 else -x)(x3)
        error = "no error"
    except jax.errors.TracerBoolConversionError as e:
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    rows = [
        {"function": "python `if` on a static argument (jit, static_argnames)",
         "calls": len(modes), "traces": traces["python_if"], "expected": len(set(modes)),
         "why": "one graph per branch taken (branch chosen at trace time)"},
        {"function": "lax.cond on a traced flag", "calls": len(flags), "traces": traces["cond"],
         "expected": 1, "why": "both branches in one graph; the flag picks at run time"},
        {"function": "same function, new input shapes", "calls": len(lengths),
         "traces": traces["shapes"], "expected": len(set(lengths)),
         "why": "shapes are static: each new shape is a new graph"},
        {"function": "python `if` on a traced value", "calls": 1, "traces": None, "expected": None,
         "why": error},
    ]
    return rows, {"python_if": traces["python_if"], "cond": traces["cond"],
                  "shapes": traces["shapes"], "expected": [r["expected"] for r in rows[:3]],
                  "cond_matches_if": all(same), "error": error}


# --- claims ----------------------------------------------------------------------------------

def check(result: Result) -> list[Check]:
    w, net, jac = result.data["worked"], result.data["network"], result.data["jac"]
    hi, vm, tr = result.data["higher"], result.data["vmap"], result.data["traces"]
    co, md = result.data["compile"], result.data["modes"]
    checks = [
        Check("f(2) = x²·sin x = 3.637 (forward value, 3 decimals)",
              round(w["value"], 3) == 3.637, round(w["value"], 3), 3.637),
        Check("f'(2): jvp (forward) = vjp (reverse) = 2x·sin x + x²·cos x",
              w["jvp_vjp_analytic_spread"] < 1e-12, round(w["derivative"], 3), 2.805,
              note="seed 001's 2.805 is an arithmetic slip: it multiplies cos x by x instead of "
                   "x² (2x·sin x + x·cos x = 2.805); the chapter's own step 4.0·(−0.416) + "
                   "0.909·4.0 gives 1.972, as JAX does"),
        Check("the chapter's own arithmetic 4.0·(−0.416) + 0.909·4.0 gives our derivative",
              abs(w["lecture_arithmetic"] - w["derivative"]) < 2e-3,
              round(w["lecture_arithmetic"], 3), "printed as 2.805"),
        Check("the printed 2.805 is 2x·sin x + x·cos x (cos x times x instead of x²)",
              round(w["slip"], 3) == 2.805, round(w["slip"], 3), 2.805),
        Check("small network: output, ∂w1, ∂w2, ∂x = 6, 3, 2, 6",
              (net["output"], net["d_w1"], net["d_w2"], net["d_x"]) == (6.0, 3.0, 2.0, 6.0),
              f"{net['output']:g}, {net['d_w1']:g}, {net['d_w2']:g}, {net['d_x']:g}", "6, 3, 2, 6"),
        Check("small network: step-by-step VJPs = jax.grad of the whole network",
              net["steps_match_grad"], net["steps_match_grad"], True),
        Check(f"few outputs, many inputs (n={jac['many_in']['n']}, m={jac['many_in']['m']}): "
              "jacrev ≥ 3× faster",
              jac["many_in"]["fwd/rev"] >= 3.0, round(jac["many_in"]["fwd/rev"], 1),
              "reverse mode for a scalar loss"),
        Check(f"many outputs, few inputs (n={jac['many_out']['n']}, m={jac['many_out']['m']}): "
              "jacfwd ≥ 3× faster",
              jac["many_out"]["fwd/rev"] <= 1 / 3, round(1 / jac["many_out"]["fwd/rev"], 1),
              "forward mode for few inputs"),
        Check("FLOPs follow n/m: jacfwd costs more for n > m, less for n < m (cost model)",
              jac["flops_order_ok"], jac["flops_ratios"], "n JVPs vs m VJPs"),
        Check("grad of grad (and of that) = the analytic 2nd and 3rd derivatives",
              hi["max_error"] < 1e-10, hi["max_error"], 0.0),
        Check("Hessian-vector product = full Hessian @ v, and ≥ 3× faster",
              hi["hvp_error"] < 1e-9 and hi["hessian/hvp"] >= 3.0,
              f"err {hi['hvp_error']:.1e}, {hi['hessian/hvp']:.1f}×", "n× fewer FLOPs"),
        Check("vmap per-example grads = a Python loop of grads, and ≥ 2× faster",
              vm["match"] and vm["loop/vmap"] >= 2.0, round(vm["loop/vmap"], 1), "vectorized"),
        Check("traces: one per static branch taken, one with lax.cond, one per distinct shape",
              [tr["python_if"], tr["cond"], tr["shapes"]] == tr["expected"] and tr["cond_matches_if"],
              [tr["python_if"], tr["cond"], tr["shapes"]], tr["expected"]),
        Check("python `if` on a traced value raises TracerBoolConversionError",
              tr["error"].startswith("TracerBoolConversionError"), tr["error"].split(":")[0],
              "no value at trace time"),
        Check("JIT: compile once (trace+lower+compile) ≥ 10× one compiled call",
              co["compile/call"] >= 10, round(co["compile/call"]), "compile once, run many"),
        Check("same model, different execution mode: eager step ≥ 2× the jitted step",
              md["eager/jit"] >= 2.0, round(md["eager/jit"], 1), "misconception 1"),
        Check("a new input shape per call recompiles: ≥ 10× a cached jitted step",
              md["new_shape/jit"] >= 10.0, round(md["new_shape/jit"]), "hidden complexity"),
    ]
    return checks


if __name__ == "__main__":
    raise SystemExit(experiments.main([ID]))
