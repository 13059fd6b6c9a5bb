"""Errors that mean "the input is wrong", each with a message naming the problem and the fix.

The CLI prints these as one line (no traceback) and exits non-zero; set MLSYS_JAX_DEBUG=1 to see
the traceback.
"""


class MlsysError(ValueError):
    """Bad input to an mlsys_jax API or command; the message says what and how to fix it."""


class PreconditionError(MlsysError):
    """A rewrite's or schedule's precondition does not hold (the reason is in the message)."""
