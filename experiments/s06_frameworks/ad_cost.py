"""Experiment 06 — what AD costs (seed 001): forward vs reverse mode as jacfwd vs jacrev across
input/output sizes, higher-order derivatives, and the Hessian-vector product vs the full Hessian."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from experiments._inputs import f32, f64
from experiments.s06_frameworks.ad_examples import f
from mlsys_jax import cost, ir, timing


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
