"""A user's function on the command line: ``FILE.py:FN``, loaded and traced for every command.

Two forms. With ``--arg`` specs, FN is the function and each spec (``f32[32,784]``) becomes a
``jax.ShapeDtypeStruct``, checked against FN's signature. Without ``--arg``, FN is a
zero-argument *example factory* that builds the model the way its library wants and returns
example arguments, parameters first (JAX's ``loss(params, batch)`` habit)::

    def make():                                    # flax linen: (f, args)
        model = ResNet18(); x = jnp.ones((8, 32, 32, 3))
        return model.apply, (model.init(jax.random.key(0), x), x)

Arguments may be any pytrees (arrays, flax variables or nnx modules, equinox modules, PRNG keys,
Python scalars): array leaves are traced, every other leaf (a string, a callable, an int) is
static. :func:`load_factory` is the one loader of factories for every command; each names the
tuple it expects (``(f, args)`` for ``inspect``/``optimize``, ``(loss_fn, params, batch)`` ...).
Importing the file and calling the factory run under a time bound, and whatever the user's code
raises or does to the process is reported as its failure (``user_code.py``).
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from mlsys_jax import runtime
from mlsys_jax.cli import user_code
from mlsys_jax.contexts import setting
from mlsys_jax.errors import MlsysError

FN_AND_ARGS = "(f, args)"
# --abstract: every factory of this command runs on shapes (ir.abstract.run_abstract)
_ABSTRACT: ContextVar[bool] = ContextVar("abstract factories", default=False)


def factories_on_shapes(on: bool):
    """While open, :func:`load_factory` runs factories under ``jax.eval_shape`` when ``on``."""
    return setting(_ABSTRACT, bool(on))


@dataclass(frozen=True)
class Target:
    """The function a command works on and the arguments it is traced with."""

    fn: Callable
    args: tuple[Any, ...]  # ShapeDtypeStructs (--arg), or a factory's example values (pytrees)
    name: str              # as the user wrote it: FILE.py:FN
    examples: bool = False  # args are example values from a factory (parameters first)

    def _split(self, constant_params: bool) -> tuple[Callable, tuple]:
        """The function of the traced arguments: with ``constant_params`` (a factory's), the
        parameters ``args[0]`` are closed over and become constants of the jaxpr."""
        if constant_params and self.examples and self.args:
            params, fn = self.args[0], self.fn
            return (lambda *rest: fn(params, *rest)), self.args[1:]
        return self.fn, self.args

    def trace(self, grad: bool = False, constant_params: bool = False):
        """The ClosedJaxpr of the function on its arguments; with ``grad``, of the gradient of
        its summed first output w.r.t. the parameters (``args[0]``'s float arrays); with
        ``constant_params``, an inference graph in which a factory's parameters are constants."""
        fn, args = self._split(constant_params and not grad)
        if grad:
            fn = _gradient_wrt_params(fn, self.name)
        return trace_user(fn, args, self.name)

    def inputs(self, constant_params: bool = False) -> list:
        """Values for the inputs of :meth:`trace`'s jaxpr: a factory's own example arrays, or
        seeded random values for ``--arg`` specs (refused, before any allocation, when they
        would not fit in this machine's memory)."""
        from mlsys_jax.ir import aval_bytes, partition, random_inputs

        leaves, _ = partition(self._split(constant_params)[1], scalars=False)
        if self.examples:
            return list(leaves)
        runtime.check_memory(sum(aval_bytes(s) for s in leaves), f"the --arg inputs of {self.name}",
                             "give smaller shapes")
        return random_inputs(leaves, seed=0)


    def parameters(self) -> list:
        """``(key path, array)`` of each array of a factory's parameters (``args[0]``), in the
        order they enter :meth:`trace`'s jaxpr: its first inputs, or (``constant_params``) its
        constants, the same arrays; empty for ``--arg`` specs."""
        import jax

        from mlsys_jax.ir import is_traced_leaf

        if not (self.examples and self.args):
            return []
        flat = jax.tree_util.tree_flatten_with_path(self.args[0])[0]
        return [(path, leaf) for path, leaf in flat if is_traced_leaf(leaf, scalars=False)]


def add_arguments(p, cost: bool = True) -> None:
    """``FILE.py:FN [--arg SPEC ...] [--x64]`` (and ``--hw``/``--dtype`` for commands that cost)."""
    p.add_argument("target", metavar="FILE.py:FN",
                   help="a function (with --arg specs) or a zero-argument factory returning "
                        f"{FN_AND_ARGS}, parameters first")
    p.add_argument("--arg", action="append", default=[], metavar="SPEC",
                   help="argument shape spec like f32[32,784] (one per positional argument)")
    p.add_argument("--x64", action="store_true",
                   help="enable float64 for the user's code (JAX's default is float32)")
    if cost:
        p.add_argument("--hw", default="h100",
                       help="hardware model: h100, h200, a100, cpu, here (every kernel measured)")
        p.add_argument("--dtype", default=None,
                       help="cost every float tensor as this dtype (e.g. bf16)")


def resolve(args) -> Target:
    """The Target named by parsed arguments (``args.target``, ``args.arg``); checks ``--hw``
    and ``--dtype`` first when the command has them, so bad options fail before any import."""
    if hasattr(args, "hw"):
        validate_cost_options(args.hw, args.dtype)
    if args.arg:
        fn = load_target(args.target)
        return Target(fn, tuple(arg_structs(args.arg, fn)), args.target)
    fn, example = load_factory(args.target, expect=FN_AND_ARGS)  # or the factory itself (API)
    name = target_name(args.target)
    if not isinstance(example, (tuple, list)):
        raise MlsysError(f"{name} must return {FN_AND_ARGS} with args a tuple of example "
                         f"arguments, parameters first, e.g. (variables, x); got args of type "
                         f"{type(example).__name__}")
    return Target(fn, tuple(example), name, examples=True)


def load_target(target: str):
    """Import ``FILE.py:FN`` and return the function (MlsysError if the file or name is missing)."""
    path, sep, name = target.rpartition(":")
    if not sep or not path or not name:
        raise MlsysError(f"expected FILE.py:FUNCTION, got {target!r} (e.g. model.py:loss)")
    file = Path(path)
    if not file.is_file():
        raise MlsysError(f"file not found: {path} (give a path to a Python file, e.g. ./model.py:loss)")
    if file.suffix != ".py":
        raise MlsysError(f"{path} is not a Python file: FILE.py:FN names a .py file and a "
                         "function in it (e.g. ./model.py:make)")
    spec = importlib.util.spec_from_file_location(f"_mlsys_user_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses (flax modules) look their module up there
    sys.path.insert(0, str(file.parent.resolve()))
    try:  # a user's file may raise anything, exit or hang: reported as one line
        user_code.run(lambda: spec.loader.exec_module(module), f"importing {path}",
                      f"could not import {path}")
    finally:
        sys.path.pop(0)
    fn = getattr(module, name, None)
    if fn is None or not callable(fn):
        names = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_")
                       and getattr(v, "__module__", None) == module.__name__)
        raise MlsysError(f"no function {name!r} in {path}; functions there: {', '.join(names) or '(none)'}")
    return fn


def load_factory(target: str, expect: str) -> tuple:
    """Call the zero-argument factory ``FILE.py:FN`` and check what it returns.

    ``expect`` names the tuple, optional parts in brackets, and is quoted in the errors:
    ``load_factory(t, "(loss_fn, params, batch[, optimizer[, rules]])")``. Returns a tuple with
    one entry per name (None for optional ones not returned); the first must be callable.
    ``target`` may also be the factory itself (the Python API's ``mlsys_jax.shard(make, ...)``),
    named in the errors by :func:`target_name`.
    """
    required, optional = _expected_names(expect)
    fn = target if callable(target) else load_target(target)
    target = target_name(target)
    needs = _required_parameters(fn)
    if needs:
        raise MlsysError(f"{target} takes {len(needs)} argument(s) ({', '.join(needs)}): give one "
                         f"--arg SPEC per positional argument, or make it a zero-argument factory "
                         f"returning {expect}")
    # the factory builds the user's model: whatever it raises is theirs
    if _ABSTRACT.get():
        from mlsys_jax.ir.abstract import run_abstract

        call = lambda: run_abstract(fn)  # noqa: E731
    else:
        call = fn
    out = user_code.run(call, f"calling the factory {target}", f"factory {target} failed")
    if not isinstance(out, (tuple, list)) or not len(required) <= len(out) <= len(required) + len(
            optional):
        got = (f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list))
               else f"a {type(out).__name__}")
        raise MlsysError(f"factory {target} must return {expect}; got {got}")
    if not callable(out[0]):
        raise MlsysError(f"factory {target} must return {expect} with {required[0]} a function; "
                         f"got a {type(out[0]).__name__}")
    return tuple(out) + (None,) * (len(required) + len(optional) - len(out))


def target_name(target) -> str:
    """``FILE.py:FN`` as given, or a function's qualified name (the Python API passes one)."""
    if isinstance(target, str):
        return target
    return getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)


def _expected_names(expect: str) -> tuple[list[str], list[str]]:
    """``"(a, b[, c[, d]])"`` -> (['a', 'b'], ['c', 'd'])."""
    body = expect.strip().removeprefix("(").removesuffix(")")
    head, _, tail = body.partition("[")
    split = lambda text: [n.strip() for n in text.replace("[", "").replace("]", "").split(",")  # noqa: E731
                          if n.strip()]
    return split(head), split(tail)


def _required_parameters(fn) -> list[str]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is p.empty
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def arg_structs(specs: list[str], fn) -> list:
    """Parse ``--arg`` specs and check their count against ``fn``'s positional parameters."""
    from mlsys_jax.ir import parse_spec

    structs = [parse_spec(s) for s in specs]
    _check_precision(specs, structs)
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


def _check_precision(specs: list[str], structs: list) -> None:
    """A 64-bit ``--arg`` needs float64 enabled for the user's code: JAX would otherwise warn and
    run it in 32 bits, a dtype the user did not ask for."""
    import jax

    wide = [s for s, st in zip(specs, structs) if st.dtype.itemsize == 8]
    if wide and not jax.config.jax_enable_x64:
        raise MlsysError(f"--arg {wide[0]}: 64-bit dtypes need --x64 (user code runs under JAX's "
                         "default, 32 bits); add --x64, or give a 32-bit dtype such as f32")


def _array_outputs(out) -> list:
    """The array leaves of a function's result (static leaves, like a label string, dropped)."""
    import jax

    from mlsys_jax.ir import is_traced_leaf

    return [leaf for leaf in jax.tree_util.tree_leaves(out) if is_traced_leaf(leaf, scalars=False)]


def _gradient_wrt_params(fn, name: str):
    """``fn``'s gradient: of its summed first array output w.r.t. the float arrays of argument 0."""
    import jax
    import jax.numpy as jnp

    from mlsys_jax.ir import partition

    def gradient(params, *rest):
        leaves, rebuild = partition(params, scalars=False)
        wrt = [i for i, leaf in enumerate(leaves) if jnp.issubdtype(leaf.dtype, jnp.floating)]
        if not wrt:
            got = ", ".join(str(getattr(leaf, "dtype", type(leaf).__name__)) for leaf in leaves)
            raise MlsysError(f"--grad differentiates w.r.t. the first argument (the parameters), "
                             f"which must be a float array or hold some; got {got or 'no arrays'}")

        def summed_first_output(floats):
            values = list(leaves)
            for i, v in zip(wrt, floats):
                values[i] = v
            outs = _array_outputs(fn(rebuild(values), *rest))
            if not outs or not jnp.issubdtype(outs[0].dtype, jnp.floating):
                got = outs[0].dtype if outs else "no array"
                raise MlsysError(f"--grad needs a float array as {name}'s first output; it "
                                 f"returns {got}")
            return jnp.sum(outs[0])
        return jax.grad(summed_first_output)([leaves[i] for i in wrt])
    return gradient


def trace_user(fn, args, name: str):
    """Trace a user's function on its arguments (array leaves traced, other leaves static)."""
    from mlsys_jax.ir import partition, trace

    leaves, rebuild = partition(tuple(args), scalars=False)

    def flat(*values):
        return _array_outputs(fn(*rebuild(values)))
    try:
        return trace(flat, *leaves)
    except MlsysError:
        raise
    except SystemExit as e:  # the user's function ended the process: report it, do not exit
        raise MlsysError(f"SystemExit({e.code!r}) raised while tracing {name}: the function must "
                         "return its outputs, not exit") from None
    except Exception as e:  # tracing runs user code: any error is the user's function failing
        shapes = ", ".join(f"{getattr(s.dtype, 'name', s.dtype)}{list(s.shape)}" for s in leaves)
        raise MlsysError(f"{name} failed to trace with arguments {shapes}: "
                         f"{type(e).__name__}: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


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
