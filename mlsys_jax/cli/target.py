"""A user's function on the command line: ``FILE.py:FN`` with ``--arg`` specs, loaded and traced.

Every command that works on a user's function (``inspect``, ``optimize``) declares its arguments
with :func:`add_arguments` and gets a :class:`Target` from :func:`resolve`: the function and the
arguments it is traced with. ``--arg`` specs become ``jax.ShapeDtypeStruct`` values, checked
against the function's signature. Another form of target (a factory returning the function and
example arguments) is one more branch in :func:`resolve`; the commands do not change.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlsys_jax.errors import MlsysError


@dataclass(frozen=True)
class Target:
    """The function a command works on and the arguments it is traced with."""

    fn: Callable
    args: tuple[Any, ...]  # jax.ShapeDtypeStruct per positional argument
    name: str              # as the user wrote it: FILE.py:FN

    def trace(self, grad: bool = False):
        """The ClosedJaxpr of the function (or of its gradient, see :func:`trace_user`)."""
        return trace_user(self.fn, list(self.args), grad=grad)


def add_arguments(p, cost: bool = True) -> None:
    """``FILE.py:FN --arg SPEC ...`` (and ``--hw``/``--dtype`` for commands that cost a graph)."""
    p.add_argument("target", metavar="FILE.py:FN")
    p.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="argument shape spec like f32[32,784] (one per positional argument)")
    if cost:
        p.add_argument("--hw", default="h100", help="hardware model: h100, h200, a100, cpu")
        p.add_argument("--dtype", default=None,
                       help="cost every float tensor as this dtype (e.g. bf16)")


def resolve(args) -> Target:
    """The Target named by parsed arguments (``args.target``, ``args.arg``); checks ``--hw``
    and ``--dtype`` first when the command has them, so bad options fail before any import."""
    if hasattr(args, "hw"):
        validate_cost_options(args.hw, args.dtype)
    fn = load_target(args.target)
    return Target(fn, tuple(arg_structs(args.arg, fn)), args.target)


def load_target(target: str):
    """Import ``FILE.py:FN`` and return the function (MlsysError if the file or name is missing)."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise MlsysError(f"expected FILE.py:FUNCTION, got {target!r} (e.g. model.py:loss)")
    file = Path(path)
    if not file.is_file():
        raise MlsysError(f"file not found: {path} (give a path to a Python file, e.g. ./model.py:loss)")
    spec = importlib.util.spec_from_file_location(f"_mlsys_user_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent.resolve()))
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # a user's file may raise anything; report it as one line
        raise MlsysError(f"could not import {path}: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        names = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise MlsysError(f"no function {name!r} in {path}; functions there: {', '.join(names) or '(none)'}")
    return fn


def arg_structs(specs: list[str], fn) -> list:
    """Parse ``--arg`` specs and check their count against ``fn``'s positional parameters."""
    from mlsys_jax.ir import parse_spec

    if not specs:
        raise MlsysError("give one --arg SPEC per positional argument, e.g. --arg f32[32,784]")
    structs = [parse_spec(s) for s in specs]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return structs
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return structs
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if not len(required) <= len(structs) <= len(positional):
        want = (f"{len(required)}" if len(required) == len(positional)
                else f"{len(required)} to {len(positional)}")
        raise MlsysError(f"{getattr(fn, '__name__', 'function')} takes {want} positional argument(s) "
                         f"({', '.join(p.name for p in positional)}); got {len(structs)} --arg")
    return structs


def trace_user(fn, structs, grad: bool = False):
    """Trace a user's function (or the gradient of its summed first output w.r.t. argument 0)."""
    import jax
    import jax.numpy as jnp

    from mlsys_jax.ir import trace

    target = fn
    if grad:
        if not jnp.issubdtype(structs[0].dtype, jnp.floating):
            raise MlsysError(f"--grad differentiates w.r.t. the first argument, which must be a "
                             f"float array; got {structs[0].dtype}")

        def summed_first_output(*args):
            leaves = jax.tree_util.tree_leaves(fn(*args))
            if not leaves:
                raise MlsysError(f"--grad differentiates {getattr(fn, '__name__', 'the function')}"
                                 "'s first output, but it returns no array; return one")
            return jnp.sum(leaves[0])

        target = jax.grad(summed_first_output)
    try:
        return trace(target, *structs)
    except MlsysError:
        raise
    except Exception as e:  # tracing runs user code: any error is the user's function failing
        msg = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise MlsysError(f"{getattr(fn, '__name__', 'function')} failed to trace with arguments "
                         f"{', '.join(s.dtype.name + str(list(s.shape)) for s in structs)}: "
                         f"{type(e).__name__}: {msg}") from None


def validate_cost_options(hw: str, dtype: str | None) -> None:
    """``--hw`` names a hardware model and ``--dtype`` a dtype (MlsysError otherwise)."""
    import jax.numpy as jnp

    from mlsys_jax.cost.hardware import NAMES
    from mlsys_jax.ir import parse_dtype

    if hw.strip().lower() not in NAMES:
        raise MlsysError(f"unknown hardware {hw!r}; use one of {', '.join(NAMES)}")
    if dtype is not None and not jnp.issubdtype(parse_dtype(dtype), jnp.floating):
        raise MlsysError(f"--dtype {dtype!r}: the cost model costs every float tensor as this "
                         "dtype, so it must be a float dtype: f16, bf16, f32 or f64")
