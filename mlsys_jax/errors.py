"""Errors that mean "the input is wrong", each with a message naming the problem and the fix.

The CLI prints these as one line (no traceback, :func:`run_command`) and exits non-zero; set
MLSYS_JAX_DEBUG=1 to see the traceback.
"""
import os
import sys


class MlsysError(ValueError):
    """Bad input to an mlsys_jax API or command; the message says what and how to fix it."""


class PreconditionError(MlsysError):
    """A rewrite's or schedule's precondition does not hold (the reason is in the message)."""


def run_command(command, prog: str = "mlsys-jax") -> int:
    """Run ``command()`` and return its exit status; a user error becomes one line on stderr.

    Wrong input (MlsysError, an unknown name: LookupError, a missing file) prints
    ``{prog}: error: <first line of the message>`` and gives 2; MLSYS_JAX_DEBUG=1 re-raises it.
    Ctrl-C gives 130; output piped into ``head`` that closes early is not an error.
    """
    try:
        return int(command() or 0)
    except (MlsysError, LookupError, FileNotFoundError) as e:
        if os.environ.get("MLSYS_JAX_DEBUG"):
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
