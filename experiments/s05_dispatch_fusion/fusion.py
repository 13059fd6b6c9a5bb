"""Experiment 05, section 3 — fusion (seed 000 §6.1, seed 003): kernels in XLA's compiled HLO vs
ops run one at a time, and the bytes the cost model says fusion saves."""
from __future__ import annotations

import math
import re
from collections import Counter

import jax
import numpy as np
from jax import lax

from experiments._inputs import normal
from mlsys_jax import cost, ir, timing

LECTURE_FUSION_RATIO = 4  # seed 000 §6.1: relu(x*2+1)*0.5, "融合前后差 4 倍"


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


def fusion_rows(size: int, conv_shape, hw: str, repeats: int):
    rng = np.random.default_rng(0)
    x = normal(rng, (size,))
    n, h, w_, c = conv_shape
    cx, cb = normal(rng, (n, h, w_, c)), normal(rng, (c,))
    cw = normal(rng, (3, 3, c, c), 1 / (3 * math.sqrt(c)))
    cases = [(f"relu(x*2+1)*0.5 on {size:,} elements", elementwise, (x,)),
             (f"relu(conv(x,W)+b), x {tuple(conv_shape)} NHWC, W 3x3", conv_bias_relu, (cx, cw, cb))]
    rows = []
    for name, fn, args in cases:
        closed = jax.make_jaxpr(fn)(*args)
        compiled = jax.jit(fn).lower(*args).compile()  # timed below too: one compile, not two
        kernels = hlo_kernels(compiled.as_text())
        t = timing.compare({"eager": lambda: fn(*args), "jit": lambda: compiled(*args)},  # noqa: B023 (called in this iteration)
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
