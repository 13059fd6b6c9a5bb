"""What the shard test modules share besides their models: the garbage collector kept off what
the process held before each test, and the examples' one-off initialisation programs compiled
as the tests compile every other program.

``frozen_gc`` (an autouse fixture; import it into a module). ``simulate`` hands freed memory back
between the phases of a run (``step.release_memory``: a full ``gc.collect()``), several times per
run. A full collection walks every object the process tracks, and a test process tracks a great
many (JAX's, flax's and Keras' modules, the compiled programs and reports of earlier tests): each
collection then costs as much as a small model's step. Frozen (``gc.freeze``) when a test starts,
they are left out of the walk; what the test itself creates is collected as in any run, and they
are unfrozen when it ends.

``quick_init(factory)``: the example factory, called with its module's own ``jax.jit`` and
``eqx.filter_jit`` (its parameters' initialisation, compiled once and run once) compiling at
``comm.QUICK_COMPILE``, as every program these tests judge is compiled. XLA's default optimisation
of a whole model's initialisation can cost more than compiling the programs a test judges; the
parameters are the same up to rounding, and nothing is judged on them. Only for factories no
other test file builds: a factory another file also builds keeps the program that file compiles,
which the session's compilation cache then shares.

    from tests.ecosystem.shard_harness import frozen_gc  # noqa: F401 (autouse fixture)
"""
import functools
import gc
import sys

import pytest

from mlsys_jax.parallel import comm


@pytest.fixture(autouse=True)
def frozen_gc():
    gc.freeze()
    yield
    gc.unfreeze()


class _QuickJit:
    """A module's ``jax`` (or ``eqx``) global as the real module, its ``jit`` (``filter_jit``)
    compiling at QUICK_COMPILE."""

    def __init__(self, real, jit: str):
        self._real, self._jit = real, jit

    def __getattr__(self, name: str):
        value = getattr(self._real, name)
        if name != self._jit:
            return value
        return functools.partial(value, compiler_options=comm.QUICK_COMPILE)


def quick_init(factory):
    """``factory`` with its own module's ``jax.jit`` and ``eqx.filter_jit`` compiling at
    QUICK_COMPILE while it runs (module docstring)."""
    module = sys.modules[factory.__module__]

    @functools.wraps(factory)
    def build(*args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:
            for name, jit in (("jax", "jit"), ("eqx", "filter_jit")):
                if hasattr(module, name):
                    patch.setattr(module, name, _QuickJit(getattr(module, name), jit))
            return factory(*args, **kwargs)
    return build
