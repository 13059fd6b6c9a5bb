"""Errors that mean "the input is wrong", each with a message naming the problem and the fix.

The CLI prints these as one line (no traceback, :func:`run_command`) and exits 2; a usage error
(:class:`UsageError`) may add one ``usage:`` hint line. Set MLSYS_JAX_DEBUG=1 to see the
traceback.
"""
import contextlib
import os
import signal
import sys
import threading


class MlsysError(ValueError):
    """Bad input to an mlsys_jax API or command; the message says what and how to fix it."""


class PreconditionError(MlsysError):
    """A rewrite's or schedule's precondition does not hold (the reason is in the message)."""


class UsageError(MlsysError):
    """A command line the parser cannot read; ``usage`` is a one-line hint printed after it."""

    def __init__(self, message: str, usage: str | None = None):
        super().__init__(message)
        self.usage = usage


BUG_EXIT = 70  # sysexits' EX_SOFTWARE: an internal error, not the user's input
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended
BUG_NOTE = "this is a bug in mlsys-jax, not in your input"
# The truth values JAX reads from its own environment variables (jax/_src/config.py, bool_env).
TRUE_WORDS = ("y", "yes", "t", "true", "on", "1")
FALSE_WORDS = ("n", "no", "f", "false", "off", "0", "")


def env_flag(name: str) -> bool:
    """The environment variable ``name`` as a truth value, read as JAX reads its own (unset or
    empty is false); MlsysError naming the variable for any other value."""
    value = os.environ.get(name, "").strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise MlsysError(f"environment variable {name}={os.environ[name]!r} is not a truth value: "
                     f"set it to 1 or 0 (or true/false, yes/no, on/off), or unset it")


def run_command(command, prog: str = "mlsys-jax") -> int:
    """Run ``command()`` and return its exit status; any error becomes one line on stderr.

    Wrong input (MlsysError, a missing file) prints ``{prog}: error: <first line of the
    message>`` (and a usage error its one ``usage:`` line) and gives 2. Anything else (a KeyError
    or IndexError included) is our bug: one line that says so and how to see the traceback, exit
    70. MLSYS_JAX_DEBUG=1 re-raises either. Ctrl-C gives one line, "interrupted", and 130; output piped into ``head`` that
    closes early is not an error.
    """
    try:
        debug = env_flag("MLSYS_JAX_DEBUG")
    except MlsysError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    try:
        with _interrupts_where_they_reach():
            return int(command() or 0)
    except (MlsysError, FileNotFoundError) as e:
        if debug:
            raise
        print(f"{prog}: error: {_first_line(e)}", file=sys.stderr)
        if getattr(e, "usage", None):
            print(e.usage, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    except Exception as e:  # the one catch-all: never a traceback unless asked for
        if debug:
            raise
        print(f"{prog}: error: {type(e).__name__}: {_first_line(e)} ({BUG_NOTE}; rerun with "
              "MLSYS_JAX_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return BUG_EXIT


REDELIVER_S = 0.05  # an interrupt held back (an import, a gc callback) is tried again after this


@contextlib.contextmanager
def _interrupts_where_they_reach():
    """Ctrl-C inside the block raises KeyboardInterrupt as usual, except while the main thread
    imports a module, or runs a garbage-collector callback or a ``__del__``: there it is held
    back and delivered again once that is done (:func:`_held_back`). A C++ extension's
    initialization (jaxlib's MLIR, nanobind's enums) calls back into Python and cannot pass a
    Python exception back up: KeyboardInterrupt there ends in std::terminate (SIGABRT,
    "terminate called"); in JAX's gc callback it is printed as "Exception ignored" and lost, and
    the command runs on to exit 0. Only where Python's own handler is in place (a process that
    ignores SIGINT stays so) and in the main thread."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return
    signal.signal(signal.SIGINT, _interrupt_unless_held_back)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _interrupt_unless_held_back(signum, frame) -> None:
    if not _held_back(frame):
        raise KeyboardInterrupt
    again = threading.Timer(REDELIVER_S, os.kill, (os.getpid(), signal.SIGINT))
    again.daemon = True
    again.start()


def _held_back(frame) -> bool:
    """Whether ``frame`` runs where a KeyboardInterrupt would not reach the command: inside an
    import (importlib's frames on its stack), a garbage-collector callback (JAX's
    ``_xla_gc_callback``) or a ``__del__`` (Python prints "Exception ignored" and goes on)."""
    import gc

    callbacks = {getattr(cb, "__code__", None) for cb in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if (code.co_filename.startswith("<frozen importlib") or code in callbacks
                or code.co_name == "__del__"):
            return True
        frame = frame.f_back
    return False


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:500] if text else type(e).__name__
