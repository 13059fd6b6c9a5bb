"""A program's values: seeded constants and inputs in its dtype, special values, PRNG keys.

Inputs are drawn from a seed (standard normal rounded to the program's dtype; small integers; fair
coins for booleans), so a program and its float64 twin see the same values. A spec with
``special`` sprinkles one to three special values into each input (docs/verification.md §2): NaN, ±Inf,
-0.0 and subnormals for floats, INT_MIN, INT_MAX, 0 and -1 for integers. A spec with ``keys``
gets that many PRNG keys after its arrays.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax.fuzz.spec import is_integer
from mlsys_jax.ir.trace import DTYPES

INPUT_KIND = {"i32": "int_input", "bool": "bool"}  # float programs: "normal"


def drawn(seed: int, shape, program_dtype, eval_dtype, *, kind: str = "normal"):
    """Seeded values, rounded to ``program_dtype``, then cast to ``eval_dtype``."""
    rng = np.random.default_rng(seed)
    if kind == "positive":
        val = rng.uniform(0.5, 2.0, shape)
    elif kind == "tiny":
        val = rng.uniform(1e-7, 1e-5, shape)
    elif kind == "int":          # integer weights and constants
        val = rng.integers(-2, 3, shape)
    elif kind == "int_input":
        val = rng.integers(-8, 9, shape)
    elif kind == "bool":
        val = rng.random(shape) < 0.5
    else:
        val = rng.standard_normal(shape)
    return np.asarray(np.asarray(val, program_dtype), eval_dtype)


def special_values(dtype) -> list:
    """The values that break real-number algebra in ``dtype``."""
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return [int(info.min), int(info.max), 0, -1]
    subnormal = float(jnp.finfo(dtype).tiny) / 4
    return [np.nan, np.inf, -np.inf, -0.0, subnormal, -subnormal]


def sprinkle(values: np.ndarray, seed: int) -> np.ndarray:
    """``values`` with one to three elements replaced by special values (their own stream)."""
    rng = np.random.default_rng([seed, 2])
    flat = values.reshape(-1).copy()
    k = min(flat.size, int(rng.integers(1, 4)))
    at = rng.choice(flat.size, size=k, replace=False)
    specials = special_values(flat.dtype)
    flat[at] = np.asarray([specials[j] for j in rng.integers(len(specials), size=k)], flat.dtype)
    return flat.reshape(values.shape)


def key_struct():
    """The abstract value of a PRNG key input (a typed key array)."""
    return jax.ShapeDtypeStruct((), jax.eval_shape(jax.random.key, 0).dtype)


def make_inputs(spec, seed: int, dtype: str | None = None) -> list:
    """Seeded inputs in the program's dtype (special values sprinkled in if ``spec.special``),
    cast to ``dtype`` (floats only: an integer program has no twin); then ``spec.keys`` PRNG
    keys."""
    prog = DTYPES[spec.dtype]
    ev = prog if is_integer(spec) else DTYPES[dtype or spec.dtype]
    out = []
    for i, shape in enumerate(spec.inputs):
        val = drawn(seed * 7919 + i, shape, prog, prog, kind=INPUT_KIND.get(spec.dtype, "normal"))
        if spec.special:
            val = sprinkle(val, seed * 7919 + i)
        out.append(jnp.asarray(np.asarray(val, ev)))
    return out + [jax.random.key((seed + 31 * j) % 2**31) for j in range(spec.keys)]


def input_structs(spec, dtype: str | None = None) -> list:
    """The abstract inputs of a spec's program (arrays, then PRNG keys), in ``dtype`` for float programs."""
    dt = DTYPES[spec.dtype if is_integer(spec) else dtype or spec.dtype]
    return ([jax.ShapeDtypeStruct(tuple(s), dt) for s in spec.inputs]
            + [key_struct() for _ in range(spec.keys)])
