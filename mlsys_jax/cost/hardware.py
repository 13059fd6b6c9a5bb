"""Hardware specs as data for the roofline model (lecture §4.2, §8.1 demo 2).

``h100`` is the lecture's model: 989.4 TFLOP/s dense BF16, 3.35 TB/s HBM, 4 µs launch overhead per
kernel. ``cpu`` is this machine, calibrated on demand (a large matmul, a memory stream, an empty
jit call) and cached in ``~/.cache/mlsys-jax/``. ``here`` (:mod:`mlsys_jax.cost.here`) is the
device JAX runs on with every kernel measured alone instead of bounded.

Each hardware also says how its compiler groups work into kernels (``fusion``, see
:mod:`mlsys_jax.cost.fusion`), whether its libraries run a contraction's elementwise epilogue in
the same kernel (``epilogue``), and which estimate is its headline (``fused_default``).
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from mlsys_jax.defaults import MEASURE_BUDGET_S  # noqa: F401 - its home is JAX-free
from mlsys_jax.errors import MlsysError

TFLOPS = 1e12


@dataclass(frozen=True)
class Hardware:
    """Peak FLOP/s per dtype, memory bandwidth (bytes/s) and per-kernel launch overhead (s)."""

    name: str
    peak_flops: dict = field(hash=False)  # dtype name ('bf16', 'f32', ...) -> FLOP/s
    bandwidth: float
    launch_s: float
    note: str = ""
    fusion: str = "adjacent"     # the fused model: "adjacent" (the lecture's) or "loop" (XLA:CPU)
    epilogue: bool = True        # a conv/matmul call with its bias epilogue is one kernel (cuDNN)
    fused_default: bool = False  # the estimate without --fused/--unfused is the fused one
    compiler: str = ("a compiler (XLA, torch.compile) fuses elementwise work into loops: it "
                     "resembles the fused estimate; eager execution, one kernel per op, the "
                     "unfused one")
    # Measured kernel times instead of the roofline's (``here``: cost.here.OperatorModel)
    timer: object = field(default=None, hash=False, compare=False, repr=False)

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for a dtype name; unknown dtypes fall back to the f32 peak."""
        return self.peak_flops.get(dtype, self.peak_flops["f32"])


# Published dense peaks (no sparsity). FP32 is the non-tensor-core rate (TF32 is opt-in).
H100 = Hardware("h100", {"bf16": 989.4 * TFLOPS, "f16": 989.4 * TFLOPS, "f8": 1978.9 * TFLOPS,
                         "i8": 1978.9 * TFLOPS, "f32": 66.9 * TFLOPS, "f64": 66.9 * TFLOPS},
                3.35e12, 4e-6, "H100 SXM5 (the lecture's model)")
H200 = Hardware("h200", dict(H100.peak_flops), 4.8e12, 4e-6, "H200 SXM: H100 compute, 4.8 TB/s HBM3e")
A100 = Hardware("a100", {"bf16": 312 * TFLOPS, "f16": 312 * TFLOPS, "i8": 624 * TFLOPS,
                         "f32": 19.5 * TFLOPS, "f64": 19.5 * TFLOPS},
                2.039e12, 4e-6, "A100 SXM 80GB")
HARDWARE = {"h100": H100, "h200": H200, "a100": A100}
NAMES = (*HARDWARE, "cpu", "here")


def get_hardware(name) -> Hardware:
    """A Hardware by name ('h100', 'h200', 'a100', 'cpu', 'here'), or a Hardware passed through."""
    if isinstance(name, Hardware):
        return name
    key = str(name).strip().lower()
    if key in ON_DEMAND:
        return ON_DEMAND[key]()
    if key not in HARDWARE:
        raise MlsysError(f"unknown hardware {name!r}; use one of {', '.join(NAMES)}")
    return HARDWARE[key]


# Hardware measured on demand, by name. ``here`` adds itself (``cost/here/device.py``, imported
# with the ``cost`` package), so this module needs nothing above it.
ON_DEMAND = {"cpu": lambda: cpu_hardware()}

CPU_COMPILER = ("XLA:CPU fuses elementwise work into loops beside each convolution and matmul "
                "call: it resembles the fused estimate")
# Bump when the calibration changes what it measures: cached figures of older versions are
# measured again.
CALIBRATION_VERSION = 2


def _cache_path() -> Path:
    from mlsys_jax.cost.cache import cache_dir

    return cache_dir() / "cpu_hardware.json"


def cpu_hardware(recalibrate: bool = False) -> Hardware:
    """This machine's CPU as a Hardware, measured once and cached under ``cost.cache.identity``
    (the CPU's model name, core count, JAX and jaxlib, the backend, XLA_FLAGS) and the
    calibration's version. A cached figure that is not a positive, finite number (a corrupt or
    hand-edited file) is said in one line and measured again."""
    import sys

    from mlsys_jax.cost.cache import identity, load, store

    ident = {**identity(), "calibration": CALIBRATION_VERSION}
    path = _cache_path()
    if not recalibrate:
        cached = load(path, ident).get("hw")
        if cached is not None:
            hw, why = _checked(cached)
            if hw is not None:
                return hw
            print(f"mlsys-jax: note: the cached CPU calibration ({path}) is unusable ({why}); "
                  "measuring it again", file=sys.stderr)
    hw = calibrate_device()
    store(path, ident, {"hw": {k: v for k, v in asdict(hw).items() if k != "timer"}})
    return hw


def _checked(cached) -> tuple[Hardware | None, str]:
    """``(Hardware, "")`` from a cache entry whose figures are all positive and finite, else
    ``(None, what is wrong)``."""
    if not isinstance(cached, dict) or not isinstance(cached.get("peak_flops"), dict):
        return None, "not a calibration's fields"
    try:
        hw = Hardware(**cached)
    except TypeError as e:
        return None, f"its fields do not match: {e}"
    from mlsys_jax.cost.cache import finite

    bad = [f"peak {k} = {v!r}" for k, v in hw.peak_flops.items() if not finite(v)]
    bad += [f"{name} = {v!r}" for name, v in (("bandwidth", hw.bandwidth),
                                              ("launch", hw.launch_s)) if not finite(v)]
    if not hw.peak_flops or "f32" not in hw.peak_flops:
        bad.append("no f32 peak")
    return (None, ", ".join(bad)) if bad else (hw, "")


def _best_time(fn, repeats: int = 7) -> float:
    """The fastest of ``repeats`` calls after a warm-up: a peak rate or a fixed overhead is what
    the machine can do, and load from other processes only ever slows a call down."""
    fn()  # warm-up (compile)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


STREAM_BYTES = 64 * 1024 * 1024  # far larger than any CPU cache: the stream runs from memory


def stream_bandwidths(repeats: int = 9, *, numpy: bool = True) -> dict:
    """Memory bandwidth (bytes/s) of XLA:CPU and of NumPy, timed side by side in interleaved
    rounds over a 64 MiB float32 array, counting one read and one write per element: medians,
    a sustained rate (and their ratio, paired round by round). ``numpy=False``: XLA's alone
    (``xla_in_place``), as the calibration reads it.

    XLA's figure is ``x + 1`` on a donated buffer, written in place: a fresh 64 MiB output would
    time the allocation and its page faults instead (measured ~10× slower), which no kernel
    inside a compiled program pays. NumPy's copy into a preallocated buffer is the check.
    """
    import jax
    import jax.numpy as jnp

    from mlsys_jax import timing

    n = STREAM_BYTES // 4
    step = jax.jit(lambda x: x + 1, donate_argnums=0)
    state = [jnp.zeros((n,), jnp.float32)]

    def xla_in_place():
        state[0] = step(state[0])
        return state[0]
    fns = {"xla": xla_in_place}
    if numpy:
        src, dst = np.ones(n, np.float32), np.empty(n, np.float32)
        fns["numpy"] = lambda: np.copyto(dst, src)
    t = timing.compare(fns, repeats=repeats, warmup=2, number=1)
    moved = 2 * STREAM_BYTES
    out = {"xla_in_place": moved / t["xla"].median_s}
    if numpy:
        out.update(numpy_copy=moved / t["numpy"].median_s,
                   ratio=timing.ratio(t["numpy"], t["xla"]).median)
    return out


def calibrate_device() -> Hardware:
    """This machine's roofline, measured: an f32 1024² matmul (peak), a donated in-place stream
    (bandwidth; the median of 5 rounds: ``bench passes`` checks it against NumPy's copy) and an
    empty jit call (launch)."""
    import jax
    import jax.numpy as jnp

    n = 1024
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    flops = 2 * n ** 3 / _best_time(lambda: mm(a).block_until_ready(), repeats=3)
    stream = stream_bandwidths(5, numpy=False)
    one = jnp.ones((), jnp.float32)
    empty = jax.jit(lambda x: x)
    launch = _best_time(lambda: empty(one).block_until_ready(), repeats=51)
    peaks = {"f32": flops, "f64": flops / 2, "bf16": flops, "f16": flops}
    return Hardware("cpu", peaks, stream["xla_in_place"], launch,
                    f"this machine ({os.cpu_count()} cores), measured: f32 matmul, a donated "
                    f"in-place stream ({stream['xla_in_place'] / 1e9:.3g} GB/s), an empty jit "
                    "call",
                    fusion="loop", epilogue=False, fused_default=True, compiler=CPU_COMPILER)
