"""Hardware specs as data for the roofline model (lecture §4.2, §8.1 demo 2).

``h100`` is the lecture's model: 989.4 TFLOP/s dense BF16, 3.35 TB/s HBM, 4 µs launch overhead per
kernel. ``cpu`` is this machine, calibrated on demand (a large matmul, a large copy, an empty jit
call) and cached in ``~/.cache/mlsys_jax/``.
"""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

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
NAMES = (*HARDWARE, "cpu")


def get_hardware(name) -> Hardware:
    """A Hardware by name ('h100', 'h200', 'a100', 'cpu'), or a Hardware passed through."""
    if isinstance(name, Hardware):
        return name
    key = str(name).strip().lower()
    if key == "cpu":
        return cpu_hardware()
    if key not in HARDWARE:
        raise MlsysError(f"unknown hardware {name!r}; use one of {', '.join(NAMES)}")
    return HARDWARE[key]


def _cache_path() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "mlsys_jax" / "cpu_hardware.json"


def cpu_hardware(recalibrate: bool = False) -> Hardware:
    """This machine's CPU as a Hardware, measured once and cached (keyed by CPU and JAX version)."""
    import jax

    key = f"{platform.processor() or platform.machine()}|{os.cpu_count()}|{jax.__version__}"
    path = _cache_path()
    if not recalibrate and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return Hardware(**data["hw"])
        except (OSError, ValueError, TypeError):
            pass
    hw = _calibrate()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "hw": asdict(hw)}))
    except OSError:
        pass
    return hw


def _median_time(fn, repeats: int = 7) -> float:
    fn()  # warm-up (compile)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _calibrate() -> Hardware:
    import jax
    import jax.numpy as jnp

    n = 1024
    a = jnp.ones((n, n), jnp.float32)
    mm = jax.jit(lambda x: x @ x)
    flops = 2 * n ** 3 / _median_time(lambda: mm(a).block_until_ready())
    big = jnp.ones((16 * 1024 * 1024,), jnp.float32)  # 64 MiB
    cp = jax.jit(lambda x: x + 1)
    bandwidth = 2 * big.nbytes / _median_time(lambda: cp(big).block_until_ready())
    one = jnp.ones((), jnp.float32)
    empty = jax.jit(lambda x: x)
    launch = _median_time(lambda: empty(one).block_until_ready(), repeats=51)
    peaks = {"f32": flops, "f64": flops / 2, "bf16": flops, "f16": flops}
    return Hardware("cpu", peaks, bandwidth, launch,
                    f"this machine ({os.cpu_count()} cores), measured: f32 matmul, copy, empty jit call")
