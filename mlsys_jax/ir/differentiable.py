"""Whether a user's function can be differentiated at all, asked before any work: JAX refuses
``jax.grad`` through a ``while_loop`` with dynamic bounds or a ``pure_callback`` without a JVP,
and that is the user's program, not a bug of ours. One line names it, and the user's line.

>>> import jax, jax.numpy as jnp
>>> def loss(w, x):
...     return jax.lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * w), (0, x))[1]
>>> try:
...     check_grad_traces(loss, (jnp.float32(2.0), jnp.float32(1.0)), what="loss_fn")
... except Exception as e:
...     print(str(e)[:50])
jax.grad of loss_fn fails: ValueError: Reverse-mod
"""
from __future__ import annotations

import jax

from mlsys_jax.errors import MlsysError


# primitives JAX may refuse to differentiate: a loss without any is not traced again
SUSPECTS = frozenset({"while", "pure_callback", "io_callback", "callback"})


def may_fail(closed) -> bool:
    """Whether ``closed`` (the function already traced) holds a primitive JAX may refuse to
    differentiate, in any body."""
    from mlsys_jax.ir.walk import walk

    return any(eqn.primitive.name in SUSPECTS for _, eqn in walk(closed))


def check_grad_traces(fn, args: tuple, *, what: str = "loss_fn", argnums=0,
                      closed=None) -> None:
    """Trace ``jax.grad(fn, argnums)`` on ``args`` (shapes only); a failure is MlsysError naming
    the user's line (the traceback's, else the equation the message names). With ``closed``
    (``fn`` already traced), only when it holds a primitive of ``SUSPECTS``."""
    from mlsys_jax.ir.provenance import blamed_line, raised_at

    if closed is not None and not may_fail(closed):
        return
    try:
        jax.eval_shape(jax.grad(fn, argnums=argnums), *args)
    except MlsysError:
        raise
    except Exception as e:  # noqa: BLE001 (whatever JAX raises for the user's program)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        line = raised_at(e)
        if not line:
            try:
                line = blamed_line(jax.make_jaxpr(fn)(*args), first)
            except Exception:  # noqa: BLE001 (the forward fails too: the message says enough)
                line = ""
        raise MlsysError(f"jax.grad of {what} fails{' at ' + line if line else ''}: "
                         f"{type(e).__name__}: {first}") from None
