"""The explicit reference executor: runs a schedule's program layer by layer on NumPy arrays.

The chain is h_i = tanh(h_{i-1} W_i), loss = ½‖h_N‖² (§7.2's network). The executor keeps only
what the program keeps, recomputes what it says, and *measures* the peak number of live
activations and the layer forwards, so the figures are counted, not derived from a formula.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat.chain.schedule import Schedule


@dataclass(frozen=True)
class ReferenceRun:
    """What the reference executor measured for one schedule."""

    loss: float
    grads: np.ndarray          # dL/dW, shape (N, D, D)
    peak_activations: int
    layer_forwards: int


def chain_inputs(n: int, width: int = 16, batch: int = 4, seed: int = 0):
    """Float64 input (batch, width) and weights (n, width, width), scaled to keep tanh unsaturated."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, width))
    ws = rng.standard_normal((n, width, width)) / np.sqrt(width)
    return x, ws


def run_reference(schedule: Schedule, x: np.ndarray, ws: np.ndarray) -> ReferenceRun:
    """Execute ``schedule`` on the tanh chain; raise if the program reads a value it freed."""
    n = schedule.n
    if ws.shape[0] != n:
        raise MlsysError(f"run_reference: schedule is for N={n} layers but ws has {ws.shape[0]}")
    live: dict[int, np.ndarray] = {0: x}
    grads = np.zeros_like(ws)
    peak, forwards, next_bwd, g, loss = 1, 0, n, None, None

    def need(i: int, op: str) -> np.ndarray:
        if i not in live:
            raise MlsysError(f"schedule {schedule.name}: {op} needs h_{i}, which is not in memory")
        return live[i]

    for op, i in schedule.actions:
        if op == "fwd":
            live[i] = np.tanh(need(i - 1, f"fwd {i}") @ ws[i - 1])
            forwards += 1
            if i == n and loss is None:
                loss = 0.5 * float(np.sum(live[n] * live[n]))
        elif op == "free":
            live.pop(i, None)
        elif op == "bwd":
            if i != next_bwd:
                raise MlsysError(f"schedule {schedule.name}: bwd {i} out of order (expected {next_bwd})")
            h, y = need(i - 1, f"bwd {i}"), need(i, f"bwd {i}")
            if g is None:
                g = y                                  # d(½‖h_N‖²)/dh_N
            dz = g * (1.0 - y * y)                     # tanh VJP uses the output (§3.2)
            grads[i - 1] = h.T @ dz
            g = dz @ ws[i - 1].T
            next_bwd -= 1
        else:
            raise MlsysError(f"schedule {schedule.name}: unknown action {op!r}")
        peak = max(peak, len(live))
    if next_bwd != 0:
        raise MlsysError(f"schedule {schedule.name}: backward stopped at layer {next_bwd + 1}")
    return ReferenceRun(loss, grads, peak, forwards)
