"""Running a user's code — importing ``FILE.py``, calling its factory — so that its failures are
reported as its failures.

User code is not ours, but what it does must not become what the tool does: a ``sys.exit(0)``
at import is not a success, its ``SystemExit(3)`` is not our exit status, a
``KeyboardInterrupt`` it raises is not the user pressing Ctrl-C, an ``os._exit`` is refused, a
thread it starts that raises is one note line, not a traceback, and an import that never
returns (waiting for input, a lock, the network) must not hang the command. So :func:`run` calls
user code in a daemon thread and waits for it. The bound (``--import-timeout``) counts the
seconds the process spends *waiting* — using almost no CPU, as code blocked on input or a lock
does — while a factory that computes (building and initializing a large model on a busy machine)
keeps its time up to :data:`BUSY_FACTOR` × the bound, with a progress line on stderr; whatever
it raises, ``BaseException`` included, becomes one :class:`~mlsys_jax.errors.MlsysError` naming the
file and what it did. A real Ctrl-C reaches the waiting main thread and stays exit 130. The
thread runs under the caller's float64 setting (JAX keeps it per thread).

:func:`exit_status` is the process's last step: threads the user's code started and left running
(a non-daemon thread Python would wait for at exit) do not keep the process alive, and the
interpreter's shutdown (where XLA's destructors can crash) is skipped.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import signal
import sys
import threading
import time
import weakref
from typing import Callable

from mlsys_jax.contexts import setting
from mlsys_jax.errors import INTERRUPTED, MlsysError

DEFAULT_IMPORT_TIMEOUT_S = 120.0
BUSY_FACTOR = 10        # a factory still computing may run this many times the bound
IDLE_CPU_SHARE = 0.05   # below this share of one core, the process counts as waiting
_POLL_S = 0.5
_BOUND = contextvars.ContextVar("import_timeout_s", default=None)
_WORKER_PREFIX = "mlsys-jax user code: "
_STARTED_BY_USER: weakref.WeakSet = weakref.WeakSet()  # threads user code started (in run)


@contextlib.contextmanager
def time_bound(seconds: float | None):
    """Bound every :func:`run` inside the block by ``seconds`` (None: the default bound). The
    block is a command's work on the user's code, so a check in that code failing as its
    program runs is reported there as the user's failure (:func:`runtime_failures`)."""
    with setting(_BOUND, seconds), runtime_failures():
        yield


def run(fn: Callable, doing: str, failed: str):
    """``fn()`` — user code — under the time bound; returns its result.

    ``doing`` says what runs (``"importing model.py"``) and ``failed`` starts the message of an
    ordinary exception (``"could not import model.py"``). MlsysError raised inside passes as is.
    """
    bound = _BOUND.get() or DEFAULT_IMPORT_TIMEOUT_S
    x64 = _x64_here()
    box: dict = {}

    def body():
        try:
            if x64 is None:
                box["value"] = fn()
            else:
                import jax

                with jax.enable_x64(x64):
                    box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - every way user code ends is reported
            box["error"] = e

    worker = threading.Thread(target=body, name=_WORKER_PREFIX + doing, daemon=True)
    before = set(threading.enumerate())
    real_exit, os._exit = os._exit, _exit_called  # os._exit skips SystemExit: caught here
    try:
        worker.start()
        waited_s, elapsed_s = _wait(worker, bound, doing)  # Ctrl-C here: KeyboardInterrupt, 130
    finally:
        os._exit = real_exit
    # threads started from the worker inherit its daemon flag: remembered, so they still count
    _STARTED_BY_USER.update(t for t in threading.enumerate() if t not in before and t is not worker)
    if worker.is_alive():
        if waited_s >= bound:
            raise MlsysError(f"{doing} did not finish: it waited {waited_s:.0f} s using no CPU "
                             f"(--import-timeout {bound:g}), as code blocked on input, a lock or "
                             "the network does; if it needs that long, give a longer "
                             "--import-timeout")
        raise MlsysError(f"{doing} was still computing after {elapsed_s:.0f} s ({BUSY_FACTOR} × "
                         f"--import-timeout {bound:g}); if building the model takes that long "
                         "here, give a longer --import-timeout")
    if "error" not in box:
        return box["value"]
    raise _as_user_failure(box["error"], doing, failed) from None


def _wait(worker: threading.Thread, bound: float, doing: str) -> tuple[float, float]:
    """Wait for ``worker`` until it ends, the process has waited ``bound`` seconds without
    computing, or ``BUSY_FACTOR × bound`` seconds have passed. Returns (seconds waited idle,
    seconds elapsed). After 3 s, stderr says what runs and for how long (every 15 s off a
    terminal), so a long import is visibly alive."""
    from mlsys_jax.progress import Progress

    start = time.monotonic()
    cpu, idle_s, progress = time.process_time(), 0.0, None
    while worker.is_alive():
        worker.join(_POLL_S)
        now, cpu_now = time.monotonic(), time.process_time()
        if cpu_now - cpu < IDLE_CPU_SHARE * _POLL_S:
            idle_s += _POLL_S
        cpu, elapsed = cpu_now, now - start
        if idle_s >= bound or elapsed >= BUSY_FACTOR * bound:
            break
        if progress is None and elapsed >= 3:
            progress = Progress("mlsys-jax", every_s=15)
            progress.t0 -= elapsed  # the work began before the line
            progress.stage(doing)
    if progress is not None:
        progress.done()
    return idle_s, time.monotonic() - start


class _ExitCalled(BaseException):
    """``os._exit(code)`` called by user code (it would end the process without a word)."""


def _exit_called(code):
    raise _ExitCalled(code)


def report_thread_failures_in_one_line() -> None:
    """For the process's own command line: a thread that ends with an exception prints one
    line, not a traceback (the thread is the user's code or a library's; the command's result
    does not depend on it)."""
    threading.excepthook = _thread_failed


def _thread_failed(args) -> None:
    if args.exc_type is SystemExit:
        return
    where = args.thread.name if args.thread is not None else "a thread"
    text = str(args.exc_value).strip()
    print(f"mlsys-jax: note: {where} (started by your code or a library) raised "
          f"{args.exc_type.__name__}{': ' + text.splitlines()[0] if text else ''}",
          file=sys.stderr)


# ---- the user's program failing as it runs ------------------------------------------------------

# the loggers through which JAX reports a Python callback that raised inside a running program
_CALLBACK_LOGGERS = ("jax._src.callback", "jax._src.debugging")
_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# what mlsys-jax was doing with the program, by the innermost of its modules on the stack
_RUNNING = {
    "value_check.py": "the value check runs it on fresh inputs drawn like the example's "
                      "(same shapes, each array's mean and spread), which need not satisfy the "
                      "check: make the function accept them (map inputs into its domain, e.g. "
                      "jnp.abs or jnp.clip, before checking) or check only what any input meets",
}
_RUNNING_DEFAULT = ("make the check hold for the inputs the factory returns, or drop it from "
                    "the function given to mlsys-jax")


class _CallbackFailures(logging.Filter):
    """Keeps the exception of a Python callback that raised inside a running program (JAX logs
    it with its traceback, then XLA raises a JaxRuntimeError carrying only its text) and drops
    the log record: the failure is reported once, in the command's one line."""

    def __init__(self):
        super().__init__()
        self.caught: list = []

    def filter(self, record) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            self.caught.append(record.exc_info[1])
            return False
        return True


@contextlib.contextmanager
def runtime_failures():
    """Inside the block, the user's program failing as it runs — a check in it (``eqx.error_if``,
    a ``jax.debug.callback`` or ``pure_callback`` that raises) rejecting the inputs it is run on —
    raises one :class:`MlsysError` naming the user's line and the check's message (exit 2), not
    XLA's multi-line error and exit 70."""
    catcher = _CallbackFailures()
    loggers = [logging.getLogger(name) for name in _CALLBACK_LOGGERS]
    for logger in loggers:
        logger.addFilter(catcher)
    try:
        yield
    except MlsysError:
        raise
    except Exception as e:  # noqa: BLE001 - classified: the user's failure, or re-raised as is
        failure = _runtime_failure(e, catcher.caught)
        if failure is None:
            raise
        raise failure from None
    finally:
        for logger in loggers:
            logger.removeFilter(catcher)


# JAX's errors that say the user's program cannot be staged as written, whoever compiles it
_UNSTAGEABLE = {
    "checkify.check which was not functionalized":
        "a checkify check must be functionalized by checkify.checkify around the whole function "
        "mlsys-jax is given (or left out of it): jax.jit of your function fails the same way",
}


def _runtime_failure(e: Exception, caught: list) -> MlsysError | None:
    """The user's failure when ``e`` is XLA reporting that a callback in the program raised,
    or JAX refusing to stage a check as the user wrote it."""
    from mlsys_jax.ir.provenance import raised_at  # JAX is loaded: it raised ``e``

    text = str(e)
    for words, fix in _UNSTAGEABLE.items():
        if words in text:
            line = raised_at(e.__cause__) if e.__cause__ is not None else None
            return MlsysError(f"your function cannot be compiled{f' at {line}' if line else ''}: "
                              f"{_first_words(e)}; {fix}")
    if type(e).__name__ not in ("JaxRuntimeError", "XlaRuntimeError") or "allback" not in text:
        return None
    original = next((c for c in reversed(caught) if str(c).split("\n")[0] in text), None)
    message = _first_words(original) if original is not None else _callback_message(text)
    line = _equinox_line(text) or (raised_at(original) if original is not None else None)
    at = f" at {line}" if line else ""
    return MlsysError(f"a check in your code failed{at} when mlsys-jax ran it: {message}; "
                      f"{_running(e)}")


def _first_words(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__.lstrip('_')}: {text.splitlines()[0] if text else ''}"


def _callback_message(text: str) -> str:
    """The exception's last line in the callback's traceback XLA passes on as text."""
    lines = [x.strip() for x in text.splitlines() if x.strip() and not x.startswith(" ")]
    found = [x for x in lines if ": " in x and not x.startswith(("INTERNAL", "Traceback"))]
    return found[0].lstrip("_") if found else lines[0][:200]


def _equinox_line(text: str) -> str | None:
    """Where ``eqx.error_if`` was called, when the failure is its check: equinox keeps the
    Python stack of that call beside the message (``equinox._jit.last_error_info``)."""
    import re

    jit = sys.modules.get("equinox._jit")
    info = getattr(jit, "last_error_info", None)
    if not info or str(info[0]) not in text:
        return None
    from mlsys_jax.ir.provenance import lines_of

    frames = [(got.group(1), int(got.group(2))) for piece in info[1] if isinstance(piece, str)
              for got in [re.search(r'File "([^"]+)", line (\d+)', piece)] if got]
    return lines_of(frames)[0]           # innermost frame first


def _running(e: BaseException) -> str:
    """What mlsys-jax was running the program for, and the fix, from where it failed."""
    tb, found = e.__traceback__, None
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename
        if os.path.abspath(name).startswith(_OURS) and os.path.basename(name) in _RUNNING:
            found = os.path.basename(name)
        tb = tb.tb_next
    return _RUNNING.get(found, _RUNNING_DEFAULT)


def _as_user_failure(e: BaseException, doing: str, failed: str) -> MlsysError:
    if isinstance(e, MlsysError):
        return e
    if isinstance(e, _ExitCalled):
        return MlsysError(f"os._exit({e.args[0]!r}) called while {doing}: user code must not end "
                          "the process")
    if isinstance(e, SystemExit):
        return MlsysError(f"SystemExit({e.code!r}) raised while {doing} (sys.exit): user code must "
                          "not end the process; call sys.exit only under "
                          "`if __name__ == '__main__':`")
    if isinstance(e, KeyboardInterrupt):
        return MlsysError(f"KeyboardInterrupt raised while {doing} (by the code itself, not by "
                          "Ctrl-C)")
    text = str(e).strip()
    hint = missing_extra(e)
    return MlsysError(f"{failed}: {type(e).__name__}: {text.splitlines()[0] if text else ''}"
                      + (f" ({hint})" if hint else ""))


def missing_extra(e: BaseException) -> str | None:
    """For a missing module that one of mlsys-jax's extras installs (flax: ``ecosystem``,
    matplotlib: ``plot``), the install line that provides it; read from the installed package's
    metadata, so the hint follows pyproject.toml."""
    import importlib.metadata
    import re

    name = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
    if not name:
        return None
    top = name.split(".")[0]
    try:
        requires = importlib.metadata.requires("mlsys-jax") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for req in requires:
        found = re.match(r"([A-Za-z0-9_.-]+).*extra == ['\"](\w+)['\"]", req)
        if not found:
            continue
        dist, extra = found.groups()
        if top in {dist.replace("-", "_"), dist.removeprefix("dm-").replace("-", "_")}:
            return f"{dist} comes with mlsys-jax's `{extra}` extra: pip install -e '.[{extra}]'"
    return None


def _x64_here() -> bool | None:
    """This thread's float64 setting, for the worker (None when JAX is not imported)."""
    if "jax" not in sys.modules:
        return None
    import jax

    return bool(jax.config.jax_enable_x64)


def exit_status(status: int) -> int:
    """End the process with ``status`` (``os._exit``; it never returns). Threads other than this
    one that Python would wait for — the user's code started them, a bounded call never returned,
    a library left a timer — do not keep it alive (one note names those the user's code started;
    no exit handlers run then). Otherwise the exit handlers run first, but not the interpreter's
    own shutdown (:func:`_run_exit_handlers`). Interrupted, the process ends at once: an
    interpreter shutting down while XLA's threads are inside a compile aborts (SIGABRT, "exception
    not rethrown") instead of exiting 130. A Ctrl-C from here on ends the process as one during
    the command does: the one line and 130, not a traceback from an exit handler."""
    _interrupt_ends_the_process(said=status == INTERRUPTED)
    me = threading.current_thread()
    left = [t for t in threading.enumerate() if t is not me and t.is_alive() and (
        not t.daemon or t in _STARTED_BY_USER or t.name.startswith(_WORKER_PREFIX))]
    if not left and status != INTERRUPTED:
        _run_exit_handlers()
        _flush_and_exit(status)
    users = [t.name for t in left if t in _STARTED_BY_USER]
    if users:
        print(f"mlsys-jax: note: exiting without waiting for {len(users)} thread(s) your code "
              f"started and left running ({', '.join(users[:3])})", file=sys.stderr)
    _flush_and_exit(status)


def _run_exit_handlers() -> None:
    """What ``atexit`` holds (JAX's, logging's, temporary folders' clean-up), run now, under the
    handler that turns a Ctrl-C into exit 130. The interpreter's own shutdown after them —
    tearing down modules and the XLA client behind them — is skipped: it can crash in XLA's
    destructors (SIGSEGV at exit) and it runs with SIGINT back at its default (a Ctrl-C there
    killed the process, -2, without the line)."""
    import atexit
    import gc

    gc.collect()  # a file object nothing refers to any more is closed, so flushed, here
    with contextlib.suppress(Exception):
        atexit._run_exitfuncs()


def _flush_and_exit(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _interrupt_ends_the_process(*, said: bool) -> None:
    """SIGINT, once the command has returned: the one line (unless ``said`` already) and exit 130
    at once (a KeyboardInterrupt raised inside an exit handler prints its traceback and is
    ignored)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def interrupted_at_exit(signum, frame) -> None:
        if not said:
            with contextlib.suppress(Exception):
                print("mlsys-jax: interrupted", file=sys.stderr)
        _flush_and_exit(INTERRUPTED)

    with contextlib.suppress(ValueError, TypeError):  # no signals here (an embedded interpreter)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, interrupted_at_exit)
