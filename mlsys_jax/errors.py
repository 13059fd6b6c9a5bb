"""Errors that mean "the input is wrong", each with a message naming the problem and the fix.

The CLI prints these as one line (no traceback, :func:`run_command`) and exits 2; a usage error
(:class:`UsageError`) may add one ``usage:`` hint line. Set MLSYS_JAX_DEBUG=1 to see the
traceback.
"""
import os
import sys


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


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:500] if text else type(e).__name__
