"""Experiment 06 — seed 001's worked AD examples (listings 2–13): f(x) = x²·sin(x) in forward mode
(``jax.jvp``) and reverse mode (one ``jax.vjp`` per step), and the small network step by step."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from experiments._inputs import f64


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
