"""Tape-mode AD (lecture §3.3, PyTorch style) on JAX's own VJP rules.

Every operation on a :class:`Tensor` runs immediately and, when some input requires a gradient,
records on the tape the VJP closure ``jax.vjp`` returns for that one operation. ``loss.backward()``
replays the tape in reverse order: each entry's VJP turns the adjoint of its output into adjoints
of its inputs, summed where paths meet (§3.1). The graph is built while the program runs, so
Python control flow is free — and gone after backward, which frees the tape (a second backward
raises, as in PyTorch, unless ``retain_graph=True``).

``requires_grad`` (§3.3): inputs that do not require a gradient are closed over instead of
differentiated, so their VJP work is skipped. Inside :func:`all_input_grads` every input is
differentiated — the lecture's minigraph tape, which computes the unused gradient of ``x`` (a
transpose and a matmul: +2 ops per step).
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp

from mlsys_jax.errors import MlsysError

_SEQ = itertools.count()
_ALL_INPUT_GRADS = [False]


@dataclass
class OpCounter:
    """Ops executed: forward applications and backward ops (op view of each VJP when counted)."""

    forward: int = 0
    backward: int = 0
    vjp_calls: int = 0

    def reset(self):
        """Zero the counters before a measured run."""
        self.forward = self.backward = self.vjp_calls = 0


COUNTER = OpCounter()


@contextlib.contextmanager
def all_input_grads():
    """Differentiate every input, ``requires_grad`` or not (the lecture's +2-op tape)."""
    _ALL_INPUT_GRADS.append(True)
    try:
        yield
    finally:
        _ALL_INPUT_GRADS.pop()


@dataclass
class _Entry:
    name: str
    inputs: tuple  # the Tensors the VJP returns adjoints for
    vjp: Callable | None
    seq: int
    out_id: int  # id() of the output Tensor (alive: later entries or the caller hold it)


def _binary(fn: Callable, name: str, reflected: bool = False):
    """A Tensor operator method recording ``fn`` under ``name`` (``reflected``: ``other op self``)."""
    def method(self, other):
        return apply(fn, other, self, name=name) if reflected else apply(fn, self, other, name=name)
    method.__name__ = name
    return method


class Tensor:
    """An eager array that remembers (on the tape) how it was computed, if gradients are needed."""

    __array_priority__ = 1000

    def __init__(self, value, requires_grad: bool = False, name: str | None = None):
        self.value = value if isinstance(value, jax.Array) else jnp.asarray(value)
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self.name = name
        self._entry: _Entry | None = None

    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)

    def __repr__(self):
        flag = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({self.value}{flag})"

    __matmul__ = _binary(jnp.matmul, "matmul")
    __add__ = __radd__ = _binary(jnp.add, "add")
    __sub__ = _binary(jnp.subtract, "sub")
    __rsub__ = _binary(jnp.subtract, "sub", reflected=True)
    __mul__ = __rmul__ = _binary(jnp.multiply, "mul")
    __truediv__ = _binary(jnp.divide, "div")

    def __neg__(self):
        return apply(jnp.negative, self, name="neg")

    def sum(self, axis=None):
        """Taped sum over ``axis`` (all axes when None)."""
        return apply(lambda v: jnp.sum(v, axis=axis), self, name="sum")

    def mean(self, axis=None):
        """Taped mean over ``axis`` (all axes when None)."""
        return apply(lambda v: jnp.mean(v, axis=axis), self, name="mean")

    @property
    def T(self):
        """Taped transpose (axes reversed)."""
        return apply(jnp.transpose, self, name="transpose")

    def backward(self, grad=None, retain_graph: bool = False, count_ops: bool = False):
        """Replay the tape in reverse from this value; accumulate ``.grad`` of leaf tensors."""
        backward(self, grad, retain_graph, count_ops)


def _wrap(x) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def apply(fn: Callable, *inputs, name: str | None = None) -> Tensor:
    """Run ``fn`` on the inputs' values now; record ``jax.vjp(fn)`` if a gradient may be needed."""
    tensors = [_wrap(x) for x in inputs]
    values = [t.value for t in tensors]
    COUNTER.forward += 1
    wants = any(t.requires_grad for t in tensors)
    if not wants:
        return Tensor(fn(*values))
    diff = [i for i, t in enumerate(tensors) if t.requires_grad or _ALL_INPUT_GRADS[-1]]

    def of_diff(*d):
        vals = list(values)
        for i, v in zip(diff, d):
            vals[i] = v
        return fn(*vals)

    out, vjp = jax.vjp(of_diff, *[values[i] for i in diff])
    result = Tensor(out, requires_grad=True)
    result._entry = _Entry(name or getattr(fn, "__name__", "op"), tuple(tensors[i] for i in diff),
                           vjp, next(_SEQ), id(result))
    return result


def relu(x):
    """Taped ReLU."""
    return apply(jax.nn.relu, x, name="relu")


def exp(x):
    """Taped elementwise exponential."""
    return apply(jnp.exp, x, name="exp")


def log(x):
    """Taped elementwise natural logarithm."""
    return apply(jnp.log, x, name="log")


def tanh(x):
    """Taped elementwise tanh."""
    return apply(jnp.tanh, x, name="tanh")


def sigmoid(x):
    """Taped elementwise logistic sigmoid."""
    return apply(jax.nn.sigmoid, x, name="sigmoid")


def _reachable(root: Tensor) -> list[_Entry]:
    seen, stack, entries = set(), [root], []
    while stack:
        t = stack.pop()
        e = t._entry
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        entries.append(e)
        stack.extend(e.inputs)
    return sorted(entries, key=lambda e: -e.seq)  # reverse tape order = reverse topological


def backward(loss: Tensor, grad=None, retain_graph: bool = False, count_ops: bool = False):
    """Reverse-mode AD over the tape (§3.1): adjoints flow back, summed where paths meet."""
    if not isinstance(loss, Tensor) or not loss.requires_grad:
        raise MlsysError("backward: the value does not require grad (no input had "
                         "requires_grad=True), so there is nothing to differentiate")
    if grad is None:
        if loss.value.shape != ():
            raise MlsysError(f"backward: a non-scalar output {loss.value.shape} needs an explicit "
                             "grad (the adjoint to start from); pass grad=")
        grad = jnp.ones_like(loss.value)
    if loss._entry is None:  # a leaf: d loss / d loss
        loss.grad = grad if loss.grad is None else loss.grad + grad
        return
    adjoint = {id(loss): grad}
    for e in _reachable(loss):
        if e.vjp is None:
            raise MlsysError(
                f"backward: the tape entry for '{e.name}' was already freed by an earlier "
                "backward(); pass retain_graph=True to the first call to backward twice")
        if e.out_id not in adjoint:
            continue  # its output does not reach the loss's adjoint (e.g. a skipped input)
        ct = adjoint.pop(e.out_id)
        if count_ops:
            from mlsys_jax.ir import op_view

            COUNTER.backward += len(op_view(jax.make_jaxpr(e.vjp)(ct)))
        COUNTER.vjp_calls += 1
        for t, g in zip(e.inputs, e.vjp(ct)):
            adjoint[id(t)] = g if id(t) not in adjoint else adjoint[id(t)] + g
            if t._entry is None and t.requires_grad:
                t.grad = g if t.grad is None else t.grad + g
        if not retain_graph:
            e.vjp = None

