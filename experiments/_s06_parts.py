"""Sections of experiment 06 (seed 001): worked AD examples, jacfwd vs jacrev, higher-order
derivatives, vmap, compile-once-run-many and execution modes. Each returns (table rows, data)."""
from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments._s05_parts import f32, small_model


def f64(a) -> jax.Array:
    """A float64 device array from host data (device_put: no per-shape program, see f32)."""
    return jax.device_put(np.asarray(a, dtype=np.float64))
from mlsys_jax import cost, ir, models, timing


# --- worked examples (seed 001 listings 2–13) ------------------------------------------------

# Seed 001, listings 3, 5, 9, 10, 12, 13 (the chapter prints 3 decimals).
LECTURE_FORWARD = {"x": (2.0, 1.0), "a = x·x": (4.0, 4.0), "b = sin(x)": (0.909, -0.416),
                   "c = a·b": (3.637, 2.805)}
LECTURE_NETWORK = {"hidden": 2.0, "activated": 2.0, "output": 6.0, "d_w2": 2.0,
                   "d_activated": 3.0, "d_hidden": 3.0, "d_w1": 3.0, "d_x": 6.0}


def f(x):
    """The chapter's f(x) = x²·sin(x), written as its three steps."""
    a = x * x
    b = jnp.sin(x)
    return a * b


def _forward_trace(x):
    """Forward mode: (value, derivative) of every step, from one jax.jvp with dx = 1."""
    def steps(x):
        a = x * x
        b = jnp.sin(x)
        return x, a, b, a * b
    return jax.jvp(steps, (x,), (jnp.ones_like(x),))


def _reverse_trace(x):
    """Reverse mode: each step's VJP, applied from the output back (listing 10's adjoints)."""
    a, vjp_square = jax.vjp(lambda x: x * x, x)
    b, vjp_sin = jax.vjp(jnp.sin, x)
    c, vjp_mul = jax.vjp(jnp.multiply, a, b)
    dc_da, dc_db = vjp_mul(jnp.ones_like(c))
    (path1,) = vjp_square(dc_da)  # x → x² → c
    (path2,) = vjp_sin(dc_db)     # x → sin x → c
    return {"dc_da": dc_da, "dc_db": dc_db, "path1": path1, "path2": path2,
            "dc_dx": path1 + path2, "grad": jax.grad(f)(x)}


@jax.jit
def _both_traces(x):
    return _forward_trace(x), _reverse_trace(x)  # one compile for both


def worked_example(x0: float):
    x = f64(x0)
    (primals, tangents), rev = _both_traces(x)
    forward = [{"step": step, "value": float(p), "derivative": float(t),
                "lecture_value": LECTURE_FORWARD[step][0],
                "lecture_derivative": LECTURE_FORWARD[step][1]}
               for step, p, t in zip(LECTURE_FORWARD, primals, tangents)]
    r = {k: float(v) for k, v in rev.items()}
    reverse = [
        {"adjoint": "dc/dc", "rule": "seed", "value": 1.0, "lecture": 1.0},
        {"adjoint": "dc/da", "rule": "∂(a·b)/∂a = b", "value": r["dc_da"], "lecture": 0.909},
        {"adjoint": "dc/db", "rule": "∂(a·b)/∂b = a", "value": r["dc_db"], "lecture": 4.0},
        {"adjoint": "path 1", "rule": "2x · dc/da", "value": r["path1"], "lecture": 3.636},
        {"adjoint": "path 2", "rule": "cos(x) · dc/db", "value": r["path2"],
         "lecture": round(-0.416 * 4.0, 3)},
        {"adjoint": "dc/dx", "rule": "path 1 + path 2", "value": r["dc_dx"], "lecture": 2.805},
    ]
    sx, cx = math.sin(x0), math.cos(x0)
    analytic = 2 * x0 * sx + x0 * x0 * cx
    derivative = float(tangents[-1])
    data = {"x": x0, "value": float(primals[-1]), "derivative": derivative, "analytic": analytic,
            "jvp_vjp_analytic_spread": max(derivative, r["dc_dx"], r["grad"], analytic)
            - min(derivative, r["dc_dx"], r["grad"], analytic),
            # the chapter's listing 3 arithmetic with its own rounded numbers
            "lecture_arithmetic": 4.0 * (-0.416) + 0.909 * 4.0,
            # what 2.805 is: cos x multiplied by x instead of by a = x²
            "slip": 2 * x0 * sx + x0 * cx}
    return forward, reverse, data


def slip_note(w: dict) -> str:
    return (f"seed 001 prints f'(2) = 2.805, but x²·cos x + 2x·sin x at x = 2 is "
            f"{w['analytic']:.4f} (jvp, vjp and grad agree); the chapter's own line "
            f"'4.0 × (−0.416) + 0.909 × 4.0' evaluates to {w['lecture_arithmetic']:.3f}. "
            f"2.805 = 2x·sin x + x·cos x = {w['slip']:.4f}: cos x was multiplied by x, not x². "
            "The value 3.637 is right; we check the derivative against the mathematics")


@jax.jit
def _network_trace(x, w1, w2):
    """Listing 13 step by step with one VJP per step, and jax.grad of the whole network."""
    hidden, vjp_mul1 = jax.vjp(jnp.multiply, x, w1)
    activated, vjp_relu = jax.vjp(lambda h: jnp.maximum(0.0, h), hidden)
    output, vjp_mul2 = jax.vjp(jnp.multiply, activated, w2)
    d_activated, d_w2 = vjp_mul2(jnp.ones_like(output))
    (d_hidden,) = vjp_relu(d_activated)
    d_x, d_w1 = vjp_mul1(d_hidden)
    whole = jax.grad(lambda x, w1, w2: jnp.maximum(0.0, x * w1) * w2, argnums=(0, 1, 2))(x, w1, w2)
    return ({"hidden": hidden, "activated": activated, "output": output, "d_w2": d_w2,
             "d_activated": d_activated, "d_hidden": d_hidden, "d_w1": d_w1, "d_x": d_x}, whole)


def small_network(x: float, w1: float, w2: float):
    steps, whole = _network_trace(*(f64(v) for v in (x, w1, w2)))
    vals = {k: float(v) for k, v in steps.items()}
    rows = [{"quantity": k, "ours": v, "lecture": LECTURE_NETWORK[k]} for k, v in vals.items()]
    vals["steps_match_grad"] = [float(g) for g in whole] == [vals["d_x"], vals["d_w1"], vals["d_w2"]]
    return rows, vals


# --- forward vs reverse cost: jacfwd vs jacrev ------------------------------------------------

JAC_NOTE = ("jacfwd pushes n tangents (one JVP per input), jacrev pulls m cotangents (one VJP per "
            "output); JAX vmaps them, so the jaxpr barely grows — the cost is in the FLOPs "
            "(cost model) and the time, which scale with n and m respectively")


def jacobian_sweep(pairs, hidden: int, repeats: int):
    rng = np.random.default_rng(0)
    fns, meta = {}, {}
    for n, m in pairs:
        w1 = f32(rng.standard_normal((hidden, n)) / math.sqrt(n))
        w2 = f32(rng.standard_normal((m, hidden)) / math.sqrt(hidden))
        x = f32(rng.standard_normal(n))
        fn = lambda x, w1=w1, w2=w2: w2 @ jnp.tanh(w1 @ x)  # f: R^n → R^m
        jf, jr = jax.jit(jax.jacfwd(fn)), jax.jit(jax.jacrev(fn))
        fns[f"fwd{n},{m}"] = lambda jf=jf, x=x: jf(x)
        fns[f"rev{n},{m}"] = lambda jr=jr, x=x: jr(x)
        closed = {mode: jax.make_jaxpr(jac(fn))(x) for mode, jac in
                  (("fwd", jax.jacfwd), ("rev", jax.jacrev))}
        meta[n, m] = {mode: (sum(ir.primitive_counts(c).values()),
                             cost.estimate(c, hw="cpu").total_flops) for mode, c in closed.items()}
    t = timing.compare(fns, repeats=repeats)
    rows = []
    for n, m in pairs:
        fwd, rev = t[f"fwd{n},{m}"], t[f"rev{n},{m}"]
        ratio = timing.ratio(fwd, rev).median
        rows.append({"n_inputs": n, "m_outputs": m, "jacfwd_us": fwd.median_us,
                     "jacrev_us": rev.median_us, "fwd/rev": ratio,
                     "winner": "jacrev" if ratio > 1 else "jacfwd",
                     "jacfwd_eqns": meta[n, m]["fwd"][0], "jacrev_eqns": meta[n, m]["rev"][0],
                     "jacfwd_flops": meta[n, m]["fwd"][1], "jacrev_flops": meta[n, m]["rev"][1]})
    flops_ok = all((r["jacfwd_flops"] > r["jacrev_flops"]) == (r["n_inputs"] > r["m_outputs"])
                   for r in rows if r["n_inputs"] != r["m_outputs"])
    many_in = max(rows, key=lambda r: r["n_inputs"] / r["m_outputs"])
    many_out = min(rows, key=lambda r: r["n_inputs"] / r["m_outputs"])
    crossover = next((f"between n/m = {a['n_inputs'] / a['m_outputs']:g} and "
                      f"{b['n_inputs'] / b['m_outputs']:g}"
                      for a, b in zip(rows, rows[1:]) if (a["fwd/rev"] > 1) != (b["fwd/rev"] > 1)),
                     "no change of winner in the sweep")
    pick = lambda r: {"n": r["n_inputs"], "m": r["m_outputs"], "fwd/rev": r["fwd/rev"]}
    return rows, {"many_in": pick(many_in), "many_out": pick(many_out),
                  "flops_order_ok": flops_ok, "crossover": crossover,
                  "flops_ratios": [round(r["jacfwd_flops"] / r["jacrev_flops"], 2) for r in rows]}


# --- higher-order derivatives -----------------------------------------------------------------

def higher_order(x0: float, n: int, repeats: int):
    x = f64(x0)
    d2 = jax.grad(jax.grad(f))
    d23 = jax.jit(lambda x: (d2(x), jax.grad(d2)(x)))  # one compile for both orders
    s, c = math.sin(x0), math.cos(x0)
    analytic = {2: 2 * s + 4 * x0 * c - x0 * x0 * s, 3: 6 * c - 6 * x0 * s - x0 * x0 * c}
    ours = dict(zip((2, 3), map(float, d23(x))))
    rows = [{"quantity": f"f{'′' * k}(x) at x = {x0:g}", "jax": "grad∘" * (k - 1) + "grad",
             "ours": ours[k], "analytic": analytic[k]} for k in (2, 3)]
    # Hessian-vector product: forward-over-reverse, O(1) gradients, vs building the n×n Hessian.
    rng = np.random.default_rng(2)
    a = f64(rng.standard_normal((n, n)) / math.sqrt(n))
    w, v = (f64(rng.standard_normal(n)) for _ in range(2))
    g = lambda w: jnp.sum(jnp.tanh(a @ w) ** 2)
    hvp = jax.jit(lambda w, v: jax.jvp(jax.grad(g), (w,), (v,))[1])
    full = jax.jit(lambda w, v: jax.hessian(g)(w) @ v)
    h_v, hess_v = np.asarray(hvp(w, v)), np.asarray(full(w, v))
    err = float(np.max(np.abs(h_v - hess_v)) / np.max(np.abs(hess_v)))
    t = timing.compare({"hvp": lambda: hvp(w, v), "hessian": lambda: full(w, v)}, repeats=repeats)
    ratio = timing.ratio(t["hessian"], t["hvp"]).median
    rows.append({"quantity": f"H·v, n = {n} (float64)", "jax": "jvp(grad(g)) vs hessian(g) @ v",
                 "ours": t["hvp"].median_us, "analytic": t["hessian"].median_us,
                 "note": f"µs: hvp vs full Hessian, {ratio:.1f}× (relative error {err:.1e})"})
    return rows, {"max_error": max(abs(ours[k] - analytic[k]) for k in ours), "hvp_error": err,
                  "hessian/hvp": ratio}


# --- vmap per-example gradients vs a Python loop ------------------------------------------------

def _loss_one(params, x, y):
    return models.mlp_loss(params, x[None], y[None])


def per_example(batch: int, repeats: int, sizes=(64, 32, 10)):
    # A small MLP: per-example work is tiny, as in per-example clipping/privacy use cases; the
    # lecture's 784→100→10 would make both sides write B × 80k gradient floats and time memory.
    params, x, y = small_model(batch, sizes)["args"]
    # Rows sliced once, outside the timing, via NumPy (iterating a jax.Array dispatches per row).
    xs, ys = ([jax.device_put(row) for row in np.asarray(a)] for a in (x, y))
    one = jax.jit(jax.grad(_loss_one))
    batched = jax.jit(jax.vmap(jax.grad(_loss_one), in_axes=(None, 0, 0)))
    loop = lambda: [one(params, xi, yi) for xi, yi in zip(xs, ys)]
    looped, vmapped = loop(), batched(params, x, y)
    vmapped = {k: np.asarray(v) for k, v in vmapped.items()}  # compare on the host
    match = all(np.allclose(vmapped[k][i], np.asarray(g[k]), rtol=1e-5, atol=1e-6)
                for i, g in enumerate(looped) for k in g)
    t = timing.compare({"loop": loop, "vmap": lambda: batched(params, x, y)}, repeats=repeats)
    ratio = timing.ratio(t["loop"], t["vmap"]).median
    rows = [{"method": f"Python loop of {batch} jitted grad calls, MLP {'→'.join(map(str, sizes))}",
             "us": t["loop"].median_us,
             "x_vs_vmap": ratio},
            {"method": "jit(vmap(grad)) — one call", "us": t["vmap"].median_us, "x_vs_vmap": 1.0}]
    return rows, {"loop/vmap": ratio, "match": match, "batch": batch}


# --- compile once, run many; execution modes --------------------------------------------------

def compile_once(batch: int, repeats: int):
    """Seed 001's JIT: the first call traces, lowers and compiles; later calls run the binary."""
    small = small_model(batch)
    fn, args = small["fn"], small["args"]
    # Another experiment in the same process (`run all`) may have compiled this very program:
    # JAX's in-memory caches would then make "compile" a lookup. Measure a cold compile.
    jax.clear_caches()
    t0 = time.perf_counter()
    traced = jax.jit(fn).trace(*args)  # Python runs once: the jaxpr (the graph)
    t1 = time.perf_counter()
    lowered = traced.lower()           # StableHLO for XLA
    t2 = time.perf_counter()
    compiled = lowered.compile()       # XLA optimizes and emits machine code
    t3 = time.perf_counter()
    phases = {"trace": t1 - t0, "lower": t2 - t1, "compile": t3 - t2}
    eager = lambda: fn(*args)
    t = timing.compare({"eager": eager, "compiled": lambda: compiled(*args)}, repeats=repeats)
    call = t["compiled"]
    rows = [{"phase": p, "ms": s * 1e3, "x_one_call": s / call.median_s} for p, s in phases.items()]
    rows.append({"phase": "one compiled call (median)", "ms": call.median_s * 1e3, "x_one_call": 1.0})
    once = sum(phases.values())
    # Seed 001's misconceptions, measured on the same model in the same run.
    modes = [{"mode": "eager (op by op, no jit)", "us": t["eager"].median_us,
              "x_vs_jit": timing.ratio(t["eager"], call).median},
             {"mode": "jit (compiled once, cached)", "us": call.median_us, "x_vs_jit": 1.0},
             {"mode": "jit meeting a new input shape (trace + lower + compile)",
              "us": once * 1e6, "x_vs_jit": once / call.median_s}]
    return rows, {"compile/call": once / call.median_s, "model": small["name"]}, modes, {
        "eager/jit": modes[0]["x_vs_jit"], "new_shape/jit": modes[2]["x_vs_jit"]}


MISCONCEPTION_NOTES = [
    "seed 001 misconception 'the same model performs the same everywhere': the same step under "
    "two execution modes of one framework differs by the eager/jit factor in execution_modes "
    "(other frameworks are not installed here; the difference inside one already refutes it)",
    "seed 001 misconception 'framework abstractions hide all system-level complexity': a jitted "
    "function silently retraces and recompiles for every new shape (traces table) — the last "
    "row of execution_modes is that cliff",
]
