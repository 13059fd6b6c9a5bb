"""Experiment 06 — static vs dynamic graphs (seed 001), as JAX sees them: traces counted."""
from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from experiments._inputs import f32


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
