"""One kernel of the cost model as a program of its own, compiled and run alone (TASO measures
each operator on the device), and the key its measured time is cached under.

A kernel (:class:`mlsys_jax.cost.model.Kernel`) is an op, or a fused group of ops, of the op
view. Its program binds the kernel's own equations, exactly as the whole program binds them, on
the kernel's inputs: values the rest of the program computes become arguments (seeded random
values of their types), and the graph's constants stay constants — XLA folds work on constants
at compile time (a BatchNorm's ``rsqrt(var + eps) * scale`` on frozen statistics), in the kernel
as in the program. XLA then compiles the group as it compiles it inside the program.

The key is the kernel's structure: each equation's primitive, params (nested bodies by
structure) and types, in order, how the inputs feed them, and for each input whether it is an
argument or a constant (a small constant by value). Two kernels with one key run the same code.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable

from mlsys_jax.compat import Literal, bind_equation
from mlsys_jax.ir.keys import jaxpr_key, value_key
from mlsys_jax.ir.primitives import COLLECTIVE_MOVES, COLLECTIVE_REDUCTIONS, MAPPED_CALLS
from mlsys_jax.ir.walk import bodies, walk_eqn

SMALL_CONSTANT_BYTES = 16  # constants up to this size are keyed by value (XLA may fold them)


@dataclass(frozen=True)
class KernelProgram:
    """A kernel as a program: ``fn(*arguments)`` returns its outputs; ``key`` names its code;
    ``unmeasurable`` says why it cannot be timed alone (empty when it can)."""

    key: str
    label: str
    fn: Callable
    arguments: tuple   # the avals of fn's arguments (the kernel's non-constant inputs)
    n_outputs: int
    unmeasurable: str = ""

    @property
    def n_inputs(self) -> int:
        """How many arguments the kernel's program takes."""
        return len(self.arguments)

    def example_arguments(self, seed: int = 0) -> list:
        """Seeded random values for the arguments, made in NumPy in their own dtype and put on
        the device (``jnp.asarray`` would compile a kernel per shape); PRNG keys from the seed."""
        import jax
        import jax.numpy as jnp
        import numpy as np

        from mlsys_jax.ir.trace import random_inputs

        rng, out = np.random.default_rng(seed), []
        for a in self.arguments:
            if jax.dtypes.issubdtype(a.dtype, jax.dtypes.extended):
                out += random_inputs([jax.ShapeDtypeStruct(a.shape, a.dtype)], seed=seed)
            elif a.dtype == np.bool_:
                out.append(jax.device_put(rng.random(a.shape) > 0.5))
            elif jnp.issubdtype(a.dtype, jnp.integer):
                out.append(jax.device_put(rng.integers(0, 10, size=a.shape).astype(a.dtype)))
            else:
                out.append(jax.device_put(rng.standard_normal(a.shape).astype(a.dtype)))
        return out


def constants(closed) -> dict:
    """Every constant variable of ``closed`` and of its nested bodies -> its value (the cost
    model's view opens named calls, whose bodies may hold constants of their own)."""
    found = dict(zip(closed.jaxpr.constvars, closed.consts))
    for eqn in closed.jaxpr.eqns:
        for _, e in walk_eqn(eqn):
            for body in bodies(e):
                found.update(zip(body.jaxpr.constvars, body.consts))
    return found


def _unmeasurable(eqns) -> str:
    for eqn in eqns:
        for _, e in walk_eqn(eqn):
            name = e.primitive.name
            if name == "while":
                return "a while loop: its trip count depends on values the kernel cannot know alone"
            if e.effects:
                return f"{name} has side effects (a callback or print): not run for timing"
            if name in COLLECTIVE_MOVES | COLLECTIVE_REDUCTIONS | MAPPED_CALLS:
                return f"{name} needs a device mesh"
    return ""


def kernel_program(kernel, consts: dict) -> KernelProgram:
    """The program of ``kernel`` (its equations, inputs and outputs, as the cost model grouped
    them), with ``consts`` (from :func:`constants`) for the inputs that are constants."""
    eqns = [e for op in kernel.ops for e in op.eqns]
    inputs, outputs = list(kernel.inputs), list(kernel.outputs)
    arguments = [v for v in inputs if v not in consts]
    fixed = {v: consts[v] for v in inputs if v in consts}

    def fn(*args):
        env = dict(zip(arguments, args))
        env.update(fixed)
        for eqn in eqns:
            ins = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
            env.update(zip(eqn.outvars, bind_equation(eqn, ins)))
        return [env[v] for v in outputs]

    key = _key(eqns, inputs, outputs, fixed)
    label = f"{kernel.name} {', '.join(kernel.in_shapes)} -> {', '.join(kernel.out_shapes)}"
    return KernelProgram(key, label, fn, tuple(v.aval for v in arguments), len(outputs),
                         _unmeasurable(eqns))


def _key(eqns, inputs, outputs, fixed: dict) -> str:
    """The kernel's equations keyed as a jaxpr of its inputs (``ir.keys.jaxpr_key``: variable
    names aside, bodies by structure, functions by name), after which of the inputs are
    constants — a small one by value."""
    def kind(v) -> str:
        if v not in fixed:
            return "arg"
        small = getattr(fixed[v], "nbytes", SMALL_CONSTANT_BYTES + 1) <= SMALL_CONSTANT_BYTES
        return f"const {value_key(fixed[v], v.aval)}" if small else "const"
    kernel = SimpleNamespace(constvars=(), invars=inputs, eqns=eqns, outvars=outputs)
    text = ";".join(kind(v) for v in inputs) + "\n" + jaxpr_key(kernel, strict=False)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
