"""Between the Python API and the commands: the commands' options as a namespace, a user's
function as ``FILE.py:FN``, and a command run in a child process with the devices it needs.

JAX fixes its device count when it starts: a notebook that ran ``jax.devices()`` has one CPU
device for good. Work that needs N devices then runs in a child process, ``mlsys-jax --devices
N COMMAND ... --json``, whose JSON is the result; the child must be able to import the user's
function, so it gets ``FILE.py:FN`` — given as such, or found from a function object defined at
the top level of a module file (:func:`importable`).
"""
from __future__ import annotations

import argparse
import inspect as pyinspect
import os
import subprocess
import sys
import threading
from pathlib import Path

from mlsys_jax.api.speak import DEVICES_HOW, translate
from mlsys_jax.errors import INTERRUPTED, MlsysError

_ERROR = "mlsys-jax: error: "


def namespace(command: str, **values) -> argparse.Namespace:
    """The options ``mlsys-jax COMMAND`` would parse with every flag at its default, then
    ``values`` (keyword -> the namespace's attribute): the command's defaults stay its own."""
    from mlsys_jax.cli.main import command_module

    parser = argparse.ArgumentParser(add_help=False)
    command_module(command).add_arguments(parser)
    defaults = {a.dest: (list(a.default) if isinstance(a.default, list) else a.default)
                for a in parser._actions}
    ns = argparse.Namespace(**defaults, abstract=False, import_timeout=None)
    unknown = set(values) - set(vars(ns)) - {"progress"}
    if unknown:  # the API's own wiring, never the caller's input
        raise TypeError(f"{command} has no option {sorted(unknown)[0]!r}")
    vars(ns).update(values)
    return ns


def display_name(fn) -> str:
    """How a user's function is named in titles and errors: ``FILE.py:FN`` or its name."""
    from mlsys_jax.cli.target import target_name

    return target_name(fn)


def importable(fn) -> str | None:
    """``FILE.py:FN`` from which a child process can load ``fn`` again: a function at the top
    level of a module with a source file (not ``__main__``, not a lambda or a nested
    function); None otherwise."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    name = getattr(fn, "__qualname__", "") or ""
    if module is None or module.__name__ == "__main__" or not name.isidentifier():
        return None
    if getattr(module, name, None) is not fn:
        return None
    try:
        path = pyinspect.getsourcefile(pyinspect.unwrap(fn)) or ""
    except TypeError:
        return None
    return f"{path}:{name}" if path.endswith(".py") and os.path.isfile(path) else None


def no_devices_line(what: str, size: int, have: int, form: str) -> str:
    """The one line for work that needs ``size`` devices, this process has ``have``, and no
    child can load the function."""
    return (f"{what} needs {size} devices and JAX here has {have}; set "
            f"{DEVICES_HOW.format(n=size)}, or pass a factory a child process can import "
            f"('file.py:make', or a zero-argument function at the top level of a module file) "
            f"returning {form}")


def run_cli(argv: list[str], *, devices: int, flags: dict, given: dict,
            progress: bool = True) -> tuple[dict, int]:
    """``mlsys-jax --devices N argv... --json`` in a child process: (its JSON object, its exit
    status). Its progress lines reach this process's stderr (with ``progress``); its one-line
    error is raised here as an MlsysError in the API's words."""
    root = str(Path(__file__).resolve().parents[2])   # the folder holding mlsys_jax
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "mlsys_jax.cli", "--devices", str(devices), *argv, "--json"]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)
    errors: list[str] = []
    relay = threading.Thread(target=_relay, args=(child.stderr, errors, progress), daemon=True)
    relay.start()
    try:
        out = child.stdout.read()
        status = child.wait()
    except KeyboardInterrupt:
        child.kill()
        raise
    relay.join()
    if status == 2 and errors:
        raise MlsysError(translate(errors[-1], flags, given))
    if status == INTERRUPTED:
        raise KeyboardInterrupt
    data = _last_json(out)
    if data is None:
        said = errors[-1] if errors else f"exit status {status}, no JSON on stdout"
        raise RuntimeError(f"the child process `mlsys-jax {' '.join(argv[:2])}` failed: {said}")
    return data, status


def _relay(stream, errors: list, show: bool) -> None:
    """Copy the child's stderr here, line by line, keeping its error lines."""
    for line in stream:
        if line.startswith(_ERROR):
            errors.append(line[len(_ERROR):].strip())
        elif not line.startswith("usage:") and (show or line.startswith("mlsys-jax: note")):
            sys.stderr.write(line)
            sys.stderr.flush()


def _last_json(text: str) -> dict | None:
    """The JSON object the command prints last (indented, so it starts on a line ``{``): the
    user's code may print before it."""
    import json

    lines = text.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start] == "{":
            try:
                return json.loads("\n".join(lines[start:]))
            except ValueError:
                return None
    return None


def precision(x64: bool | None):
    """The user's code under float64 (True), float32 (False), or JAX's current setting (None)."""
    import contextlib

    if x64 is None:
        return contextlib.nullcontext()
    import jax

    return jax.enable_x64(bool(x64))


def user_target(f, args: tuple, ns):
    """The ``cli.target.Target`` of ``f`` and ``args``, as ``inspect``/``optimize`` take it.

    No ``args``: ``f`` is a factory returning ``(f, args)`` (``"file.py:make"`` or the function,
    the command's loader and checks). With ``args``: ``f`` is the function (or ``"file.py:fn"``)
    and ``args`` its arguments — values (parameters first) or ``jax.ShapeDtypeStruct``\\ s or spec
    strings (``"f32[32,784]"``), which are drawn at random where values are needed, as the
    command's ``--arg``.
    """
    from mlsys_jax.cli import target

    if not args:
        ns.target, ns.arg = f, []
        return target.resolve(ns)
    target.validate_cost_options(ns.hw, ns.dtype)
    fn = target.load_target(f) if isinstance(f, str) else f
    if not callable(fn):
        raise MlsysError(f"expected a function (or 'file.py:fn') and its arguments; got a "
                         f"{type(fn).__name__}")
    name = display_name(f)
    if all(isinstance(a, str) for a in args):
        return target.Target(fn, tuple(target.arg_structs(list(args), fn)), name)
    return target.Target(fn, tuple(args), name, examples=not _shapes_only(args))


def _shapes_only(args) -> bool:
    import jax

    from mlsys_jax.ir import partition

    leaves, _ = partition(tuple(args), scalars=False)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
