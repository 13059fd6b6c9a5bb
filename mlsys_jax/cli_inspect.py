"""``mlsys-jax inspect FILE.py:FN --arg SPEC ...``: a user's function as a costed graph.

Also home of the helpers every command that takes a user's function shares: loading
``FILE.py:FN``, checking ``--arg`` specs against its signature, and tracing with one-line errors.
"""
from __future__ import annotations

import importlib.util
import inspect as pyinspect
import json
import sys
from pathlib import Path

from mlsys_jax.errors import MlsysError


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
        params = list(pyinspect.signature(fn).parameters.values())
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
            out = fn(*args)
            first = jax.tree_util.tree_leaves(out)[0]
            return jnp.sum(first)

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
    from mlsys_jax.cost.hardware import NAMES
    from mlsys_jax.ir import parse_dtype

    if hw.strip().lower() not in NAMES:
        raise MlsysError(f"unknown hardware {hw!r}; use one of {', '.join(NAMES)}")
    if dtype is not None:
        parse_dtype(dtype)


def report_json(report) -> dict:
    """The ``--json`` object shared by inspect and optimize."""
    return {"ops": [{"name": k.name, "primitives": list(k.primitives), "flops": k.flops,
                     "bytes": k.bytes, "time_us": k.time_us} for k in report.kernels],
            "total": report.totals(), "unknown": list(report.unknown),
            "primitives": dict(report.primitives)}


def inspect_main(args) -> int:
    from mlsys_jax.cost import estimate
    from mlsys_jax.ir import to_dot
    from mlsys_jax.report import format_table

    validate_cost_options(args.hw, args.dtype)
    fn = load_target(args.target)
    closed = trace_user(fn, arg_structs(args.arg, fn), grad=args.grad)
    report = estimate(closed, hw=args.hw, dtype=args.dtype, fused=args.fused)
    if args.dot:
        Path(args.dot).write_text(to_dot(closed, name=args.target))
    if args.json:
        print(json.dumps(report_json(report), indent=1))
        return 0
    print(closed)
    rows = [{k: r[k] for k in ("name", "in", "out", "flops", "bytes", "intensity", "bound", "time_us")}
            for r in report.rows()]
    hw = report.hardware
    print(format_table(rows, title=f"\n[kernels: {'fused' if args.fused else 'one per op'}; "
                                   f"{hw.name}, {args.dtype or 'native dtypes'}]"))
    t = report.totals()
    print(f"\ntotal: {t['kernels']} kernels, {t['flops'] / 1e9:.4g} GFLOP, {t['bytes'] / 1e6:.4g} MB, "
          f"{t['time_us']:.4g} µs; peak live {t['peak_bytes'] / 1e6:.4g} MB")
    if report.unknown:
        print(f"unknown primitives (no cost rule, counted as 0 FLOPs): {', '.join(report.unknown)}")
    if args.dot:
        print(f"DOT written to {args.dot}")
    return 0
