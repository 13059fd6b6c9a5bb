"""Spec → Python function → traced jaxpr (docs/verification.md §2: real programs' features come for free).

``make_function(spec)`` writes the program with ordinary jnp/lax code, so the jaxpr has what user
code has: nested jit (``jnp.where``), ``custom_jvp_call[relu]``, weak literals, captured constants,
``stop_gradient``. ``make_function(spec, "f64")`` is the same program in float64 — the reference
of the numeric oracles — with the *same* constant and input values (drawn, rounded to the
program's dtype, then widened). Integer and boolean programs compute in int32 (their node ops are
in :mod:`mlsys_jax.fuzz.integer_ops`) and have no float64 twin: they are judged bitwise.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from mlsys_jax.compat import ClosedJaxpr
from mlsys_jax.fuzz.integer_ops import IntOps
from mlsys_jax.fuzz.user_ops import UserOps
from mlsys_jax.fuzz.inputs import drawn, input_structs, make_inputs
from mlsys_jax.fuzz.opaque import opaque
from mlsys_jax.fuzz.spec import CONV_DIMS, Spec, is_integer
from mlsys_jax.ir.trace import DTYPES
from mlsys_jax.models.resnet import batch_norm

__all__ = ["build", "make_function", "make_inputs", "input_structs"]



def _debug_sink(*_):
    """The host side of the generated debug callbacks (a print without the output)."""


class _Ops(IntOps, UserOps):
    """The meaning of each node op, for one program dtype and one evaluation dtype."""

    def __init__(self, spec: Spec, eval_dtype):
        self.spec, self.integer, self.keys = spec, is_integer(spec), []
        # integer programs compute in int32 (boolean ones from their boolean inputs), no twin
        self.prog = DTYPES["i32"] if self.integer else DTYPES[spec.dtype]
        self.dt = self.prog if self.integer else eval_dtype
        self.axis = 1 if spec.layout == "nchw" else -1

    def const(self, seed, shape, kind="normal", scale=1.0):
        if self.integer:
            return self.fixed(drawn(seed, shape, self.prog, self.prog, kind="int"))
        return self.fixed(drawn(seed, shape, self.prog, self.prog, kind=kind)
                          * np.asarray(scale, self.prog))

    def fixed(self, value):
        """A build-time constant, computed in the program's dtype and then widened, so that the
        float64 twin holds exactly the program's constants (``oracles.mirrors`` relies on it)."""
        return np.asarray(np.asarray(value, self.prog), self.dt)

    def channel(self, v, z):  # a per-channel vector broadcast along the channel axis
        return v.reshape(1, -1, 1, 1) if self.axis == 1 else v

    def run(self, nodes, env: list) -> list:
        for node in nodes:
            args = [env[a] for a in node["args"]]
            env.append(getattr(self, "op_" + node["op"])(node, *args))
        return env

    # -- elementwise -------------------------------------------------------------------------
    def op_unary(self, n, x):
        f = n["fn"]
        if self.integer:
            return self.int_unary(f, x)
        table = {"neg": jnp.negative, "sin": jnp.sin, "tanh": jnp.tanh, "abs": jnp.abs,
                 "square": jnp.square, "cos": jnp.cos, "logistic": jax.nn.sigmoid,
                 "exp_tanh": lambda x: jnp.exp(jnp.tanh(x)), "log1p_sq": lambda x: jnp.log1p(x * x),
                 "relu": jax.nn.relu, "where_relu": lambda x: jnp.where(x > 0, x, 0.0),
                 "stop_gradient": lax.stop_gradient}
        return table[f](x)

    def op_binary(self, n, a, b):
        f = n["fn"]
        if self.integer:
            return self.int_binary(f, a, b)
        if f == "div":
            return a / (1.0 + b * b)  # a denominator that is never 0 (precondition)
        return {"add": jnp.add, "mul": jnp.multiply, "sub": jnp.subtract,
                "max": jnp.maximum}[f](a, b)

    def op_scalar(self, n, x):
        c = n["c"]  # a Python float (int): a weak-typed literal
        if self.integer:
            return self.int_scalar(n["fn"], c, x)
        return {"add": lambda: x + c, "mul": lambda: x * c, "sub": lambda: x - c}[n["fn"]]()

    def op_pow(self, n, x):
        return x ** n["y"]

    def op_reduce(self, n, x):
        return jnp.sum(x, axis=n["axis"], keepdims=True)

    def op_nan_unsafe(self, n, x):
        zero = 0 if self.integer else 0.0
        fns = {"mul0": lambda: x * zero, "sub_self": lambda: x - x, "div_self": lambda: x / x}
        return fns[n["fn"]]()

    # -- constants ---------------------------------------------------------------------------
    def op_const(self, n):
        c = jnp.asarray(self.const(n["seed"], n["shape"]))
        if self.integer:
            return self.int_const(n["fn"], c)
        return {"sin": lambda: jnp.sin(c) * 2.0, "affine": lambda: c * 0.5 + 1.0,
                "square": lambda: c * c}[n["fn"]]()

    def op_wconst(self, n):
        if self.integer:
            return self.int_wconst(n["fn"], n["c"])
        s = jnp.asarray(n["c"])  # weak-typed scalar (a Python float)
        return jnp.cos(s) if n["fn"] == "cos" else jnp.exp(s)

    # -- contractions ------------------------------------------------------------------------
    def op_matmul(self, n, x):
        k = x.shape[-1]
        return x @ self.const(n["seed"], (k, n["n"]), scale=k ** -0.5)

    def op_conv(self, n, x):
        layout = self.spec.layout
        cin = x.shape[1 if layout == "nchw" else 3]
        k, g, out = n["k"], n["groups"], n["out"]
        shape = (out, cin // g, k, k) if layout == "nchw" else (k, k, cin // g, out)
        w = self._weights(n, shape, k * k * cin // g)
        pad = n["pad"] if isinstance(n["pad"], str) else [tuple(p) for p in n["pad"]]
        prec = lax.Precision.HIGHEST if n["precision"] == "highest" else None
        low, acc = self._low(n), {}
        if low is not None:  # 16-bit weights (and input), float32 accumulation
            x, w, acc = x.astype(low), jnp.asarray(w).astype(low), {"preferred_element_type": x.dtype}
        return lax.conv_general_dilated(x, w, (n["stride"],) * 2, pad, rhs_dilation=(n["dil"],) * 2,
                                        dimension_numbers=CONV_DIMS[layout],
                                        feature_group_count=g, precision=prec, **acc)

    def op_bn(self, n, z):
        c, s, eps = z.shape[self.axis], n["seed"], n["eps"]
        gamma = self.const(s, (c,), "positive",
                           scale=(-1.0 if n["neg_gamma"] else 1.0) * n.get("gscale", 1.0))
        beta, mean = self.const(s + 1, (c,)), self.const(s + 2, (c,))
        var = self.const(s + 3, (c,), "tiny" if n["var"] == "tiny" else "positive")
        # jnp, not NumPy, arithmetic on the constants: NumPy promotes bfloat16 + float to float32
        form, ch = n["form"], (lambda v: self.channel(jnp.asarray(v), z))
        if form == "named":  # the library's jitted batch_norm (NCHW, its own eps)
            return batch_norm(z, gamma, beta, mean, var)
        if form == "rsqrt":
            return ch(gamma) * (z - ch(mean)) * lax.rsqrt(ch(var) + eps) + ch(beta)
        if form == "div":
            return (z - ch(mean)) / jnp.sqrt(ch(var) + eps) * ch(gamma) + ch(beta)
        # a general per-channel affine, scale and shift given (computed as fixed() says)
        prog = lambda v: np.asarray(v, self.prog)  # noqa: E731
        scale = prog(gamma) / np.sqrt(prog(var) + eps)
        shift = prog(beta) - prog(mean) * scale
        return z * ch(self.fixed(scale)) + ch(self.fixed(shift))

    def op_train_bn(self, n, z):
        axes = (0, 2, 3) if self.axis == 1 else (0, 1, 2)
        mean = jnp.mean(z, axis=axes, keepdims=True)  # batch statistics: must not be folded
        var = jnp.var(z, axis=axes, keepdims=True)
        return (z - mean) * lax.rsqrt(var + 1e-3)

    # -- effects and opaque ops --------------------------------------------------------------
    def op_debug(self, n, x):
        jax.debug.callback(_debug_sink, jnp.sum(x))
        return x

    def op_opaque(self, n, x):
        return opaque(x)

    # -- wrappers ----------------------------------------------------------------------------
    def body(self, n):
        def fn(x):
            return self.run(n["body"], [x])[-1]
        fn.__name__ = fn.__qualname__ = n["name"]
        return fn

    def op_jit(self, n, x):
        return jax.jit(self.body(n))(x)

    def op_checkpoint(self, n, x):
        policy = getattr(jax.checkpoint_policies, n["policy"]) if n.get("policy") else None
        return jax.checkpoint(self.body(n), policy=policy)(x)

    def op_cond(self, n, x):
        return lax.cond(jnp.sum(x) > 0, self.body(n), jnp.negative, x)

    def op_scan(self, n, x):
        fn = self.body(n)
        return lax.scan(lambda c, _: (fn(c), None), x, None, length=2)[0]

    def op_while(self, n, x):
        fn = self.body(n)
        return lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, fn(s[1])),
                              (jnp.int32(0), x))[1]

    def op_custom_jvp(self, n, x):
        fn = self.body(n)
        f = jax.custom_jvp(fn)
        f.defjvp(lambda primals, tangents: jax.jvp(fn, primals, tangents))
        return f(x)

    def op_custom_vjp(self, n, x):
        fn = self.body(n)
        f = jax.custom_vjp(fn)
        f.defvjp(lambda x: jax.vjp(fn, x), lambda vjp_fn, g: vjp_fn(g))
        return f(x)


def make_function(spec: Spec, dtype: str | None = None):
    """The program as a Python function ``f(*inputs) -> tuple of outputs``."""
    ops = _Ops(spec, DTYPES[dtype or spec.dtype])

    def program(*inputs):
        n = len(spec.inputs)  # arrays are the DAG's first values; PRNG keys come after them
        ops.keys = list(inputs[n:])
        env = ops.run(spec.nodes, list(inputs[:n]))
        return tuple(env[o] for o in spec.outputs)
    return program


def build(spec: Spec, dtype: str | None = None) -> ClosedJaxpr:
    """The traced ClosedJaxpr of the program (in the program's dtype unless ``dtype`` is given)."""
    return jax.make_jaxpr(make_function(spec, dtype))(*input_structs(spec, dtype))
