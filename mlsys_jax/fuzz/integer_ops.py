"""The integer meaning of the generated node ops, and the ops on masks and PRNG keys.

Mixed into :class:`mlsys_jax.fuzz.program._Ops`: where a node op has a float meaning (``unary``,
``binary``, ``scalar``, ``const``), integer programs take the function of the same name here.
Every divisor is odd or drawn nonzero and every shift amount is masked into range, so no program
divides by zero or shifts by more than the width (XLA defines both, NumPy does not).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.fuzz.inputs import drawn

CMP = {"gt": jnp.greater, "lt": jnp.less, "eq": jnp.equal, "ne": jnp.not_equal,
       "ge": jnp.greater_equal}
LOGIC = {"and": jnp.logical_and, "or": jnp.logical_or, "xor": jnp.logical_xor}


def _odd_divisor(b):
    """A nonzero divisor from any integer: ((b & 7) - 4) | 1 is one of -3, -1, 1, 3."""
    return ((b & 7) - 4) | 1


class IntOps:
    """Integer and boolean node ops (``self.prog``: int32 constants; ``self.axis``: channels)."""

    def _lit(self, c, x):  # a scalar of x's dtype (a literal in the jaxpr)
        return np.asarray(c, x.dtype)

    def int_unary(self, fn, x):
        """An integer unary op by name, on ``x``."""
        table = {"neg": jnp.negative, "abs": jnp.abs, "square": lambda x: x * x,
                 "not": jnp.invert, "sign": jnp.sign, "clamp": lambda x: jnp.clip(x, -5, 5),
                 "relu": jax.nn.relu, "where_relu": lambda x: jnp.where(x > 0, x, 0),
                 "shl": lambda x: lax.shift_left(x, self._lit(2, x)),
                 "shr": lambda x: lax.shift_right_arithmetic(x, self._lit(1, x)),
                 "shr_logical": lambda x: lax.shift_right_logical(x, self._lit(3, x))}
        return table[fn](x)

    def int_binary(self, fn, a, b):
        """An integer binary op by name; operands broadcast and divisors made safe."""
        # lax's division and shifts take one dtype and shape: a weak scalar operand joins a's
        b = jnp.broadcast_to(b.astype(a.dtype), jnp.broadcast_shapes(a.shape, b.shape))
        a = jnp.broadcast_to(a, b.shape)
        table = {"add": jnp.add, "mul": jnp.multiply, "sub": jnp.subtract, "max": jnp.maximum,
                 "min": jnp.minimum, "and": jnp.bitwise_and, "or": jnp.bitwise_or,
                 "xor": jnp.bitwise_xor,
                 "div": lambda a, b: lax.div(a, _odd_divisor(b)),        # truncating
                 "rem": lambda a, b: lax.rem(a, _odd_divisor(b)),
                 "shl": lambda a, b: lax.shift_left(a, b & 15),
                 "shr": lambda a, b: lax.shift_right_arithmetic(a, b & 31)}
        return table[fn](a, b)

    def int_scalar(self, fn, c, x):
        """An integer op of ``x`` with the constant ``c``."""
        table = {"add": lambda: x + c, "mul": lambda: x * c, "sub": lambda: x - c,
                 "div": lambda: lax.div(x, self._lit(c, x)),
                 "rem": lambda: lax.rem(x, self._lit(c, x)),
                 "shl": lambda: lax.shift_left(x, self._lit(c, x)),
                 "shr": lambda: lax.shift_right_arithmetic(x, self._lit(c, x)),
                 "shr_logical": lambda: lax.shift_right_logical(x, self._lit(c, x))}
        return table[fn]()

    def int_const(self, fn, c):
        """An integer op on a constant alone."""
        return {"div": lambda: lax.div(c, self._lit(3, c)), "affine": lambda: c * 3 + 1,
                "square": lambda: c * c}[fn]()

    def int_wconst(self, fn, c):
        """An op on a weak-typed Python int constant."""
        s = jnp.asarray(c)  # weak-typed (a Python int)
        return s * 2 if fn == "double" else lax.div(s, 2)

    # -- masks ----------------------------------------------------------------------------------
    def op_cmp(self, n, a, b):
        """A comparison node of two values."""
        return CMP[n["fn"]](a, b)

    def op_cmpc(self, n, x):
        """A comparison node of a value with its constant."""
        return CMP[n["fn"]](x, n["c"])

    def op_logic(self, n, p, q=None):
        """A boolean logic node (``not`` takes one operand)."""
        return jnp.logical_not(p) if n["fn"] == "not" else LOGIC[n["fn"]](p, q)

    def op_select(self, n, p, x, y):
        """A ``where`` node: ``x`` where ``p``, else ``y``."""
        return jnp.where(p, x, y)

    def op_from_bool(self, n, b):
        """A boolean turned back into the program's integer dtype."""
        if n["fn"] == "astype":
            return b.astype(self.prog)
        return jnp.where(b, np.asarray(3, self.prog), np.asarray(-2, self.prog))

    # -- integer "normalisation" after a conv ---------------------------------------------------
    def op_ibn(self, n, z):
        """An integer per-channel normalisation after a conv, with drawn per-channel constants."""
        c, s, axis = z.shape[self.axis], n["seed"], self.axis % z.ndim
        a = self.fixed(drawn(s, (c,), self.prog, self.prog, kind="int"))
        b = self.fixed(drawn(s + 1, (c,), self.prog, self.prog, kind="int"))
        d = drawn(s + 2, (c,), self.prog, self.prog, kind="int")
        d = self.fixed(np.where(d == 0, 3, d))                      # nonzero per-channel divisor
        full = lambda v: lax.broadcast_in_dim(jnp.asarray(v), z.shape, (axis,))  # noqa: E731
        ch = lambda v: self.channel(jnp.asarray(v), z)  # noqa: E731
        return {"affine": lambda: z * ch(a) + ch(b),                # exact: foldable
                "scalar_div": lambda: lax.div(z, self._lit(3, z)),  # truncating: not foldable
                "div": lambda: lax.div(z, full(d)),
                "rem": lambda: lax.rem(z, full(d)),
                "mul_div": lambda: lax.div(z * ch(d), self._lit(2, z)),
                "shift": lambda: lax.shift_right_arithmetic(z, self._lit(1, z)),
                "floordiv": lambda: jnp.floor_divide(z, ch(d))}[n["form"]]()

    # -- PRNG keys ------------------------------------------------------------------------------
    def op_rng(self, n, x):
        """x combined with random values drawn in the program's dtype (the float64 twin draws
        the same values, widened)."""
        f, key = n["fn"], (self.keys[0] if self.keys else None)
        if f == "const_key" or key is None:
            key = jax.random.key(n["seed"])
        if f in ("fold_in",):
            key = jax.random.fold_in(key, n["seed"])
        if self.integer:
            if f == "bits":
                return x ^ lax.bitcast_convert_type(jax.random.bits(key, x.shape, jnp.uint32),
                                                    x.dtype)
            return x + jax.random.randint(key, x.shape, -3, 4, x.dtype)
        if f == "normal_split":
            return x + jax.random.normal(jax.random.split(key)[1], x.shape,
                                         self.prog).astype(x.dtype)
        r = jax.random.uniform(key, x.shape, self.prog).astype(x.dtype)
        return x * r if f == "fold_in" else x + r
