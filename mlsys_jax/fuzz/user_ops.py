"""The meaning of the node ops that imitate what users write (docs/verification.md §2).

Mixed into :class:`mlsys_jax.fuzz.program._Ops`. Our own motifs draw the lecture's patterns; users'
code adds a jitted helper with a name (``jit[name=conv_block]``) holding a conv and a bias that may
run along any axis (H, W or the batch as well as the channels, with equal lengths), Dense layers
with a bias and a BatchNorm (flax ``nn.Dense`` + ``nn.BatchNorm``), attention scores scaled by
``1/√d`` before or after the ``q·kᵀ`` matmul, the typed literals JAX 0.10 makes of
``lax.stop_gradient`` of a Python scalar (equinox's ``Dropout``), and weights kept in float16 or
bfloat16 with float32 accumulation. The float64 twin computes the same program exactly: casts to a
16-bit dtype become casts to float64, the constants keep the values the program holds.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.fuzz.spec import CONV_DIMS
from mlsys_jax.ir.trace import DTYPES


def along(v, ndim: int, axis: int):
    """A vector shaped to broadcast along ``axis`` of an ``ndim``-D value (as users index it:
    ``b[None, None, :, None]``)."""
    return v[tuple(slice(None) if d == axis else None for d in range(ndim))]


class UserOps:
    """User-style node ops (``self.prog``: the program's dtype; ``self.dt``: the evaluation one)."""

    def _low(self, n):
        """(weight dtype, compute dtype): a 16-bit weight dtype in the program, none in the twin."""
        wd = n.get("wdtype")
        if not wd or self.integer:
            return None
        return DTYPES[wd] if self.dt == self.prog else None

    def _weights(self, n, shape, fan_in):
        scale = n.get("wscale", 1.0) * fan_in ** -0.5
        w = self.const(n["seed"], shape, scale=scale)
        wd = n.get("wdtype")
        if wd and not self.integer:  # the values a 16-bit weight holds, in either program
            w = np.asarray(np.asarray(np.asarray(w, DTYPES[wd]), self.prog), self.dt)
        return w

    def op_helper(self, n, x):
        """``@jax.jit def conv_block(x, w, b): return conv(x, w) + b`` with the bias along
        ``n["axis"]`` of the output."""
        layout = self.spec.layout
        cin = x.shape[1 if layout == "nchw" else 3]
        k, out = n["k"], n["out"]
        shape = (out, cin, k, k) if layout == "nchw" else (k, k, cin, out)
        w = self._weights(n, shape, k * k * cin)
        out_shape = list(x.shape)
        out_shape[1 if layout == "nchw" else 3] = out
        b = self.const(n["seed"] + 1, (out_shape[n["axis"]],))

        def conv_block(x, w, b):
            z = lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=CONV_DIMS[layout])
            return z + along(b, 4, n["axis"])
        conv_block.__name__ = conv_block.__qualname__ = n.get("name", "conv_block")
        return jax.jit(conv_block)(x, jnp.asarray(w), jnp.asarray(b))

    def op_dense(self, n, x):
        """``x @ W (+ b along an axis)``, W maybe 16-bit with float32 accumulation."""
        w = self._weights(n, (x.shape[-1], n["n"]), x.shape[-1])
        low = self._low(n)
        if low is not None:
            y = jnp.dot(x.astype(low), jnp.asarray(w).astype(low), preferred_element_type=x.dtype)
        else:
            y = x @ jnp.asarray(w)
        if n.get("bias_axis") is not None:
            a = n["bias_axis"]
            y = y + along(jnp.asarray(self.const(n["seed"] + 1, (y.shape[a],))), y.ndim, a)
        return y

    def op_attention(self, n, x):
        """softmax of scaled ``q·kᵀ`` (the scale on q, on the scores, or a division), times x."""
        d = x.shape[-1]
        wq = jnp.asarray(self._weights(n, (d, d), d))
        wk = jnp.asarray(self.const(n["seed"] + 2, (d, d), scale=d ** -0.5))
        bq = jnp.asarray(self.const(n["seed"] + 3, (d,)))
        q, k = x @ wq + bq, x @ wk
        form = n["form"]  # Python floats, as users write them: weak, so q keeps its dtype
        if form == "q_scaled":
            s = (q / math.sqrt(d)) @ k.T
        elif form == "scores_scaled":
            s = (q @ k.T) * (1.0 / math.sqrt(d))
        else:
            s = (q @ k.T) / jnp.sqrt(float(d))
        return jax.nn.softmax(s, axis=-1) @ x

    def op_typed(self, n, x):
        """Typed literals: ``stop_gradient`` of a Python scalar is a JAX 0.10 ``TypedFloat`` or
        ``TypedInt`` in the jaxpr (equinox's ``Dropout`` divides by ``1 - stop_gradient(p)``)."""
        f = n["fn"]
        if self.integer or f == "mul_int":
            return x * lax.stop_gradient(3)
        if f == "div":
            return x / (1 - lax.stop_gradient(0.25))
        return jnp.where(x > lax.stop_gradient(0.0), x, lax.stop_gradient(0.5) * x)
