"""What a call costs besides its kernels: the dispatch overhead of one ``jax.jit`` call and the
overhead of each further kernel inside a compiled program, measured on this backend.

A kernel timed alone is one jit call: Python and PJRT dispatch (a fixed cost, plus a little per
argument and rather more per output buffer) around the kernel's own work. Inside a compiled
program the kernels run back to back with a small cost each (XLA:CPU's thunk executor), and the
program pays one dispatch. So the measured-operator model adds a kernel's time alone minus the
dispatch of its own call, and one dispatch for the whole program: the figures here.

``call_us + per_input_us · inputs + per_output_us · outputs`` is fitted (least squares) to jit
calls of trivial programs over a small grid of argument and output counts; ``per_kernel_us`` is
the slope of a chain of tiny kernels that XLA cannot fuse (an optimization barrier between
cumulative sums).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

import numpy as np

# (inputs, outputs): four points for three unknowns — each is a compile on a cold first run (a
# slope from 1 to 16 buffers stands out of the noise: the per-buffer costs are ~0.1–1 µs)
GRID = ((1, 1), (16, 1), (1, 8), (8, 8))
CHAIN = (1, 32)  # kernels in the two chains whose difference gives the per-kernel overhead


@dataclass(frozen=True)
class DispatchCost:
    """Overheads in µs: a jit call, per argument, per output, per extra kernel in a program."""

    call_us: float
    per_input_us: float
    per_output_us: float
    per_kernel_us: float

    def call(self, n_inputs: int, n_outputs: int) -> float:
        """µs of dispatching one jit call with this many arguments and outputs."""
        return self.call_us + self.per_input_us * n_inputs + self.per_output_us * n_outputs

    def to_dict(self) -> dict:
        """The figures as plain data, for JSON output and the cache."""
        return asdict(self)


def _trivial(n_inputs: int, n_outputs: int):
    import jax
    import jax.numpy as jnp

    xs = [jnp.full((8,), i, jnp.float32) for i in range(n_inputs)]

    def f(*args):
        total = args[0]
        for x in args[1:]:
            total = total + x
        return [total * float(k + 1) for k in range(n_outputs)]
    return partial(jax.jit(f), *xs)


def _chain(n: int):
    import jax
    import jax.numpy as jnp
    from jax import lax

    def f(x):
        for _ in range(n):
            x = lax.optimization_barrier(jnp.cumsum(x, axis=0))
        return x
    return partial(jax.jit(f), jnp.ones((4, 4), jnp.float32))


def dispatch_calls() -> dict:
    """The jit calls :func:`measure_dispatch` times (name -> zero-argument call), not compiled
    yet: the measured model compiles them beside its first kernels (a cold run's cost)."""
    calls = {f"io{i}x{o}": _trivial(i, o) for i, o in GRID}
    calls.update({f"chain{n}": _chain(n) for n in CHAIN})
    return calls


def warm(call) -> None:
    """One call, waited for: its compile."""
    import jax

    jax.block_until_ready(call())


def measure_dispatch(repeats: int = 5, min_time_s: float = 0.002,
                     calls: dict | None = None) -> DispatchCost:
    """Measure the overheads here (interleaved rounds, each the best of 2 batches; medians,
    stopping early where decided: ``rounds.timed``). ``calls``: :func:`dispatch_calls`, already
    compiled (else made and compiled here)."""
    from mlsys_jax.cost.here.rounds import compile_all, timed

    if calls is None:
        calls = dispatch_calls()
        compile_all([], warm=[partial(warm, c) for c in calls.values()])  # at once: a cold cost
    t = timed(calls, repeats=repeats, min_time_s=min_time_s)
    design = np.array([[1.0, i, o] for i, o in GRID])
    us = np.array([t[f"io{i}x{o}"].median_us for i, o in GRID])
    (call, per_in, per_out), *_ = np.linalg.lstsq(design, us, rcond=None)
    per_in, per_out = max(float(per_in), 0.0), max(float(per_out), 0.0)
    if call <= 0:  # a loaded machine's noise tilted the fit: the smallest call, less its buffers
        call = us[0] - per_in - per_out
    short, long = CHAIN
    per_kernel = (t[f"chain{long}"].median_us - t[f"chain{short}"].median_us) / (long - short)
    return DispatchCost(max(float(call), 0.0), max(float(per_in), 0.0), max(float(per_out), 0.0),
                        max(float(per_kernel), 0.0))
