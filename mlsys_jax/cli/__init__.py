"""The ``mlsys-jax`` command line: one module per command, one loader for a user's function.

``main.py`` parses and dispatches (``COMMANDS`` lists the commands), ``target.py`` loads a
user's ``FILE.py:FN`` (a function with ``--arg`` specs, or an example factory) for every command
that takes one, and each command lives in its own module (``run``, ``inspect``, ``optimize``,
``bench``, ``fuzz``, ``shard``, ``remat``); ``headline.py`` (the unfused and fused estimates side
by side) and ``check.py`` (optimize's value check) serve ``inspect`` and ``optimize``. Tables are rendered by
:mod:`mlsys_jax.tables`.
"""
try:
    from mlsys_jax.cli.main import main
except KeyboardInterrupt:  # Ctrl-C while the command starts, before main() can catch it
    import os
    import sys

    if os.path.basename(sys.argv[0]) not in ("mlsys-jax", "-m"):
        raise  # imported by Python code: its Ctrl-C is its own
    sys.stderr.write("mlsys-jax: interrupted\n")
    raise SystemExit(130) from None  # errors.INTERRUPTED (importing errors could be cut short)

__all__ = ["main"]
