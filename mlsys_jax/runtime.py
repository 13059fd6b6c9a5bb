"""Process-level set-up that must happen before JAX starts: simulated devices and float64.

JAX reads ``XLA_FLAGS`` once, when its CPU backend initialises, so the simulated device count
(the lecture's "GPUs" of §5) must be set before the first computation. The CLI, the test suite and
``python -m experiments.…`` all go through :func:`configure`. Float64 is the lecture's (its exact
checks): the experiments turn it on for themselves, while a user's code runs under JAX's own
defaults unless the user asks (:func:`user_precision`).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys

from mlsys_jax.errors import MlsysError

DEFAULT_DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"


def configure(devices: int | None = DEFAULT_DEVICES, x64: bool = True) -> None:
    """Set the simulated CPU device count (before JAX's backend starts) and enable float64.

    Raises ValueError if ``devices`` is not a positive integer, and RuntimeError if JAX's backend
    is already running with a different device count (the flag can no longer take effect).
    """
    if devices is not None:
        if not isinstance(devices, int) or devices < 1:
            raise MlsysError(f"--devices/devices must be a positive integer, got {devices!r}")
        flags = re.sub(rf"{_FLAG}=\d+", "", os.environ.get("XLA_FLAGS", "")).strip()
        os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={devices}".strip()
        if _backend_started():
            import jax

            have = jax.local_device_count()
            if jax.default_backend() == "cpu" and have != devices:
                raise MlsysError(
                    f"JAX already started with {have} CPU devices; {devices} requested. "
                    "Call mlsys_jax.runtime.configure() before any JAX computation.")
    if x64:
        enable_x64()


def enable_x64() -> None:
    """Turn on float64 support (the lecture checks equalities in float64)."""
    import jax

    jax.config.update("jax_enable_x64", True)


@contextlib.contextmanager
def user_precision(x64: bool):
    """Run a user's code under JAX's defaults — float32, or float64 where the user asked for it
    (``--x64``, or ``JAX_ENABLE_X64`` set, as JAX itself reads it) — whatever this process
    enabled for the lecture's own code."""
    import jax

    asked = os.environ.get("JAX_ENABLE_X64", "").strip().lower() in ("1", "true", "yes", "on")
    with jax.enable_x64(bool(x64) or asked):
        yield


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from mlsys_jax.compat import backend_started

    return backend_started()
