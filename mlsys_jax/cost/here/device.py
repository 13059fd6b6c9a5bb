"""``here``: the device JAX runs on as a Hardware, its kernels measured (``operators.py``).

Backend-generic: the device is ``jax.devices()[0]``, whatever its platform. Its roofline — the
bound every measured kernel is set against (measured time over roofline time: how far this
backend is from the hardware's bound) — is ``cpu``'s calibration on a CPU, a published spec for
a GPU whose kind names one (H100, H200, A100), and otherwise the same calibration run on that
device. XLA compiles for every backend the same way: elementwise work fused into loops beside
each contraction (a GPU's libraries also take a contraction's epilogue).
"""
from __future__ import annotations

from dataclasses import replace

from mlsys_jax.cost import cache
from mlsys_jax.cost.hardware import (HARDWARE, ON_DEMAND, Hardware, calibrate_device,
                                     cpu_hardware)

HERE_COMPILER = ("XLA fuses elementwise work into loops beside each convolution and matmul; "
                 "each kernel of that fused model was compiled and timed alone here, so the "
                 "fused estimate is the prediction")
_HARDWARE: dict = {}


def _roofline_of(platform: str, kind: str) -> Hardware:
    if platform == "cpu":
        return cpu_hardware()
    for name, spec in HARDWARE.items():
        if name in kind.lower().replace(" ", ""):
            return replace(spec, fusion="loop", epilogue=True)
    return replace(calibrate_device(), epilogue=True)


def here_hardware(model=None) -> Hardware:
    """``here`` as a Hardware whose kernel times come from the measured-operator model: this
    process's for the cache directory, or ``model`` (an ``OperatorModel``, e.g. with its own
    cache file). Each model object has its own Hardware: two objects on one file each hold
    their own entries, and a Hardware memoised by the file would time with the first one."""
    from mlsys_jax.cost.here.operators import operator_model

    if model is not None:
        if model.hardware is None:
            model.hardware = _hardware_of(model)
        return model.hardware
    where = cache.cache_dir()
    if where not in _HARDWARE:
        _HARDWARE[where] = here_hardware(operator_model())
    return _HARDWARE[where]


def _hardware_of(model) -> Hardware:
    ident = model.identity
    base = _roofline_of(ident["platform"], ident["device_kind"])
    note = (f"{ident['platform']} ({ident['device_kind']}, {ident['cores']} cores): each "
            f"kernel compiled and timed alone, cached; roofline bound from {base.name}")
    return replace(base, name="here", note=note, fusion="loop", fused_default=True,
                   compiler=HERE_COMPILER, timer=model)


ON_DEMAND["here"] = here_hardware
