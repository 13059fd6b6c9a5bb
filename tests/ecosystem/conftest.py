"""Users' models run under JAX's defaults: float32, whatever the rest of the suite enables.

The suite turns float64 on for the lecture's exact checks (tests/conftest.py); a flax or equinox
model would then be traced in float64, which no user of those libraries does.
"""
import os
import sys

import jax
import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "examples")
sys.path.insert(0, EXAMPLES)  # the example factories import each other (equinox_mlp uses flax_mlp)


@pytest.fixture(autouse=True)
def float32_defaults():
    with jax.enable_x64(False):
        yield
