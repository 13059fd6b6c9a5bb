"""A check in the user's program failing as it runs is the user's failure: one MlsysError (exit 2)
naming the user's line and the check's message, never XLA's error as "a bug in mlsys-jax" (exit
70); anything else passes through unchanged (``user_code.runtime_failures``). equinox's
``error_if`` and a diffrax solve: tests/ecosystem/test_diffrax.py."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mlsys_jax.cli import user_code
from mlsys_jax.errors import MlsysError


def _positive_only(x):
    if np.any(np.asarray(x) < 0):
        raise ValueError("x must be non-negative")  # the user's line


@jax.jit
def with_callback(x):
    jax.debug.callback(_positive_only, x)
    return x * 2


def _line_of(fn, marker: str) -> str:
    lines, start = inspect.getsourcelines(fn)
    return f"test_runtime_failures.py:{start + next(i for i, t in enumerate(lines) if marker in t)}"


def test_a_callback_raising_names_its_line_and_message():
    with pytest.raises(MlsysError) as got, user_code.runtime_failures():
        jax.block_until_ready(with_callback(-jnp.ones(3)))
    text = str(got.value)
    assert "\n" not in text and "x must be non-negative" in text
    assert _line_of(_positive_only, "the user's line") in text


def test_inputs_meeting_the_check_run_and_other_errors_pass_through():
    with user_code.runtime_failures():
        assert float(with_callback(jnp.ones(3)).sum()) == 6.0
    with pytest.raises(KeyError), user_code.runtime_failures():
        raise KeyError("ours")
