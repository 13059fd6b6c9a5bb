"""Process-level set-up that must happen before JAX starts: the environment, simulated devices
and float64.

JAX reads ``XLA_FLAGS`` once, when its CPU backend initialises, so the simulated device count
(the lecture's "GPUs" of §5) must be set before the first computation. The CLI, the test suite and
``python -m experiments.…`` all go through :func:`configure`. Float64 is the lecture's (its exact
checks): the experiments turn it on for themselves, while a user's code runs under JAX's own
defaults unless the user asks (:func:`user_precision`). The CLI checks the environment it and JAX
read before JAX starts (:func:`check_environment`, :func:`import_jax`, :func:`start_backend`), so
a bad value is one line naming the variable, not a traceback or an aborted process.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

from mlsys_jax.errors import MlsysError, env_flag

DEFAULT_DEVICES = 8
# Each simulated device costs start-up time and memory (docs/jax-notes.md), and the lecture's
# layouts need at most 8.
MAX_DEVICES = 1024
_FLAG = "--xla_force_host_platform_device_count"
_FLAG_VALUE = re.compile(rf"{_FLAG}=(\S*)")


def configure(devices: int | None = DEFAULT_DEVICES, x64: bool = True) -> None:
    """Set the simulated CPU device count (before JAX's backend starts) and enable float64.

    Raises ValueError if ``devices`` is not a positive integer, and RuntimeError if JAX's backend
    is already running with a different device count (the flag can no longer take effect).
    """
    if devices is not None:
        if not isinstance(devices, int) or not 1 <= devices <= MAX_DEVICES:
            raise MlsysError(f"--devices/devices must be an integer from 1 to {MAX_DEVICES} "
                             f"(simulated CPU devices), got {devices!r}")
        flags = _FLAG_VALUE.sub("", os.environ.get("XLA_FLAGS", "")).strip()
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

    with jax.enable_x64(bool(x64) or env_flag("JAX_ENABLE_X64")):
        yield


# ---- the environment: every variable the tool and JAX read, checked before JAX starts ---------

def check_environment() -> None:
    """MLSYS_JAX_DEBUG and JAX_ENABLE_X64 are truth values, and XLA_FLAGS holds flags whose device
    count (``--devices`` replaces it) is an integer from 1 to MAX_DEVICES (MlsysError otherwise)."""
    env_flag("MLSYS_JAX_DEBUG")
    env_flag("JAX_ENABLE_X64")
    flags = os.environ.get("XLA_FLAGS", "")
    for token in flags.split():
        if not token.startswith("--"):
            raise MlsysError(f"XLA_FLAGS={flags!r}: {token!r} is not a flag; XLA_FLAGS holds "
                             f"flags such as {_FLAG}=8, separated by spaces")
    for value in _FLAG_VALUE.findall(flags):
        if not value.isdigit() or not 1 <= int(value) <= MAX_DEVICES:
            raise MlsysError(f"XLA_FLAGS: {_FLAG}={value!r} is not a device count from 1 to "
                             f"{MAX_DEVICES}; remove it (mlsys-jax sets the count from --devices, "
                             f"default {DEFAULT_DEVICES})")


def import_jax():
    """``import jax``, where JAX reads its own ``JAX_*`` variables: one it cannot read is an
    MlsysError naming it, not an import-time traceback."""
    try:
        import jax
    except ValueError as e:
        text = str(e).splitlines()[0] if str(e).strip() else type(e).__name__
        named = [k for k, v in os.environ.items() if k.startswith("JAX_") and v.strip()
                 and (k in text or repr(v.strip().lower()) in text or repr(v.strip()) in text)]
        where = f" ({', '.join(sorted(named))})" if named else " (a JAX_* variable)"
        raise MlsysError(f"JAX cannot read its environment{where}: {text}; fix or unset that "
                         "variable") from None
    return jax


def start_backend() -> None:
    """Start JAX's backend now, so that what it cannot start with is one line: flags XLA refuses
    in XLA_FLAGS (XLA would abort the process, so they are tried first in a forked child) and a
    platform JAX_PLATFORMS names that this machine lacks."""
    if _backend_started():
        return
    if any(not t.startswith(f"{_FLAG}=") for t in os.environ.get("XLA_FLAGS", "").split()):
        _try_xla_flags_in_child()
    jax = import_jax()
    try:
        jax.devices()
    except RuntimeError as e:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MlsysError(f"JAX could not start its backend: {text}") from None


def _try_xla_flags_in_child() -> None:
    """Start a backend in a forked child (JAX imported, no backend yet) and raise MlsysError with
    XLA's own line if XLA rejects XLA_FLAGS there."""
    if not hasattr(os, "fork"):
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: start a backend with these flags, report only by exit status
        try:
            os.dup2(write, 2)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
            import jax

            jax.devices()
            code = 0
        except BaseException:  # noqa: BLE001 - any failure is reported by the parent
            code = 3
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        err = f.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) == 0:
        return
    lines = [line for line in err.splitlines() if "XLA_FLAGS" in line or "flag" in line.lower()]
    said = (lines or err.strip().splitlines() or ["no message"])[0]
    said = re.sub(r"^[FEW]\d{4} [\d:.]+\s+\d+ \S+\] ", "", said)  # glog's prefix
    raise MlsysError(f"XLA refuses XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}: "
                     f"{said.strip()[:300]}; fix or unset XLA_FLAGS")


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from mlsys_jax.compat import backend_started

    return backend_started()


# ---- the machine's memory: sizes are checked against it before any work starts ------------------

def available_memory_bytes() -> int:
    """Memory this process can still use: Linux's MemAvailable (else all physical memory), capped
    by an address-space limit (``ulimit -v``) if one is set."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            avail = 1 << 62  # unknown: no limit from us
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            avail = min(avail, soft)
    except (ImportError, OSError, ValueError):
        pass
    return int(avail)


def format_bytes(n: int | float) -> str:
    """Bytes in the largest binary unit that fits, 3 significant digits (``1.5 GB``)."""
    for unit, size in (("EB", 1 << 60), ("PB", 1 << 50), ("TB", 1 << 40), ("GB", 1 << 30),
                       ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def check_memory(estimate_bytes: int, what: str, fix: str) -> None:
    """Refuse (MlsysError) work whose estimated memory exceeds what the machine has available,
    before any of it is allocated; the message gives the estimate, the limit and ``fix``."""
    limit = available_memory_bytes()
    if estimate_bytes > limit:
        raise MlsysError(f"{what} needs about {format_bytes(estimate_bytes)} of memory, more than "
                         f"the {format_bytes(limit)} available on this machine; {fix}")


# ---- where outputs go: checked before the run, not after it ------------------------------------

def check_output_dir(path: str, option: str) -> None:
    """``path`` is a folder we can write into, or can be created (MlsysError naming ``option``)."""
    p = os.path.abspath(path)
    if os.path.exists(p) and not os.path.isdir(p):
        raise MlsysError(f"{option} {path!r} is a file, not a folder; give a folder path (it is "
                         "created if missing)")
    _check_writable_ancestor(p, path, option)


def check_output_file(path: str, option: str) -> None:
    """``path`` names a file we can write (MlsysError naming ``option`` otherwise)."""
    p = os.path.abspath(path)
    if os.path.isdir(p):
        raise MlsysError(f"{option} {path!r} is a folder; give a file path, e.g. "
                         f"{os.path.join(path, 'graph.dot')}")
    if os.path.exists(p):
        try:  # what writing needs (root ignores mode bits, not a ro mount); a FIFO won't block
            os.close(os.open(p, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
        except OSError as e:
            raise MlsysError(f"{option} {path!r} is not writable ({e.strerror}); give a path "
                             "you can write") from None
        return
    parent = os.path.dirname(p)
    if not os.path.isdir(parent):
        raise MlsysError(f"{option} {path!r}: folder {os.path.dirname(path) or '.'!r} does not "
                         "exist; create it first or give another path")
    _check_writable_ancestor(p, path, option)


def _check_writable_ancestor(p: str, path: str, option: str) -> None:
    """The nearest existing folder of ``p`` (itself included) is one we can write into."""
    here = p
    while not os.path.exists(here):
        here = os.path.dirname(here)
    if not os.path.isdir(here):
        raise MlsysError(f"{option} {path!r}: {here!r} is a file, not a folder")
    try:  # a real attempt: permission bits do not bind root, read-only mounts and /proc do
        tempfile.TemporaryFile(dir=here).close()
    except OSError as e:
        raise MlsysError(f"{option} {path!r}: cannot write in {here!r} ({e.strerror}); give a "
                         "path you can write") from None
