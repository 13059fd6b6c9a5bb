"""Local worker processes, watched together: the first one to fail stops them all, by name.

A multi-process SPMD run is as reliable as its least reliable worker: one that is killed, stopped
or lost leaves the others blocked in a collective until JAX's heartbeat gives up (minutes). So
:func:`supervise` watches every worker at once, several times a second, and at the first
failure — a non-zero exit, a signal, a worker stopped (SIGSTOP/SIGTSTP), or the whole run past
its deadline — kills the others and raises one MlsysError that names the worker and the cause.
:func:`start` launches the workers; any command that runs N local processes (``run 04
--processes N`` through :func:`mlsys_jax.parallel.multiprocess.launch`) uses the pair.

A worker that fails in Python prints ``ERROR_MARKER`` and a one-line reason on stderr; that
line is what the parent reports (never native stack text).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field

from mlsys_jax.errors import MlsysError

ERROR_MARKER = "MLSYS_JAX_WORKER_ERROR "
STOPPED_AFTER_S = 1.0   # a worker stopped this long is reported (job control stops all at once)
POLL_S = 0.05
_GLOG = re.compile(r"^[EF]\d{4} [\d:.]+\s+\d+ \S+\] (.*)$")  # E1201 11:46:48.7 22234 f.cc:83] msg


@dataclass
class Worker:
    """One started worker: its index, process, and the lines it printed so far."""

    index: int
    proc: subprocess.Popen
    out: list = field(default_factory=list)
    err: list = field(default_factory=list)
    readers: list = field(default_factory=list)

    def reason(self) -> str:
        """Why it failed, in one line: its own ERROR_MARKER line, else the last error that JAX's
        runtime logged (glog ``E``/``F`` lines), else — for a normal exit — its last stderr line
        (a Python exception); never native stack text."""
        marked = [line[len(ERROR_MARKER):] for line in self.err if line.startswith(ERROR_MARKER)]
        logged = [m.group(1) for m in map(_GLOG.match, self.err) if m]
        plain = [line for line in self.err if line.strip()] if self.proc.returncode > 0 else []
        lines = marked or logged or plain
        return lines[-1].strip()[:300] if lines else ""


def die_with_parent() -> None:
    """Called first thing in a worker (Linux): it gets SIGKILL when its parent dies, so no worker
    outlives its run. (Set by the worker itself: a ``preexec_fn`` would make the parent fork
    while JAX's threads run.)"""
    parent = os.getppid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def _drain(stream, lines: list) -> None:
    for line in stream:
        lines.append(line.rstrip("\n"))
    stream.close()


def start(commands: list, env: dict | None = None) -> list:
    """Start one process per command (stdout and stderr drained by threads, so a chatty worker
    never blocks on a full pipe; no stdin: the parent's may be a channel, as under pytest-xdist);
    returns the :class:`Worker` list."""
    workers = []
    for i, cmd in enumerate(commands):
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        w = Worker(i, proc)
        for stream, lines in ((proc.stdout, w.out), (proc.stderr, w.err)):
            t = threading.Thread(target=_drain, args=(stream, lines), daemon=True)
            t.start()
            w.readers.append(t)
        workers.append(w)
    return workers


def stop_all(workers: list) -> None:
    """SIGKILL every worker still running (a stopped one too) and reap it."""
    for w in workers:
        if w.proc.poll() is None:
            w.proc.kill()
    for w in workers:
        try:
            w.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            pass


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped by a signal (Linux /proc; False where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def describe_exit(returncode: int) -> str:
    """How a worker process ended, for messages: the signal that killed it or its exit code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with code {returncode}"


def supervise(workers: list, *, timeout_s: float, what: str) -> list:
    """Wait for every worker to exit 0 and return their stdout lines (one list per worker).

    At the first failure the others are killed and MlsysError names the culprit: ``{what}:
    worker i (pid p) was killed by SIGKILL`` / ``exited with code c: <its reason>`` / ``is
    stopped`` / ``did not finish within T s``. ``what`` names the run (and its coordinator)."""
    deadline = time.monotonic() + timeout_s
    stopped_since: dict = {}
    try:
        while True:
            running = [w for w in workers if w.proc.poll() is None]
            failed = next((w for w in workers if w.proc.returncode not in (None, 0)), None)
            if failed is not None:
                _fail(workers, failed, describe_exit(failed.proc.returncode), what)
            if not running:
                break
            now = time.monotonic()
            for w in running:
                if not is_stopped(w.proc.pid):
                    stopped_since.pop(w.index, None)
                elif now - stopped_since.setdefault(w.index, now) >= STOPPED_AFTER_S:
                    _fail(workers, w, "is stopped (SIGSTOP/SIGTSTP): the others would wait for "
                                      "it forever", what)
            if now > deadline:
                late = ", ".join(str(w.index) for w in running)
                _fail(workers, running[0], f"did not finish within {timeout_s:.0f} s (still "
                                           f"running: worker(s) {late})", what)
            time.sleep(POLL_S)
    finally:
        stop_all(workers)
    for w in workers:
        for t in w.readers:
            t.join(timeout=5)
    return [list(w.out) for w in workers]


def _fail(workers: list, culprit: Worker, cause: str, what: str):
    stop_all(workers)
    for t in culprit.readers:
        t.join(timeout=2)
    reason = culprit.reason()
    others = len(workers) - 1
    raise MlsysError(f"{what}: worker {culprit.index} (pid {culprit.proc.pid}) {cause}"
                     + (f": {reason}" if reason and "stopped" not in cause else "")
                     + f"; stopped the other {others} worker{'s' if others != 1 else ''}")
