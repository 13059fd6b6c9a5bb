"""The ``mlsys-jax`` command line: one module per command, one loader for a user's function.

``main.py`` parses and dispatches (``COMMANDS`` lists the commands), ``target.py`` loads a
user's ``FILE.py:FN`` (a function with ``--arg`` specs, or an example factory) for every command
that takes one, and each command lives in its own module (``run``, ``inspect``, ``optimize``,
``bench``, ``fuzz``, ``shard``, ``remat``); ``headline.py`` (the unfused and fused estimates side
by side) and ``check.py`` (optimize's value check) serve ``inspect`` and ``optimize``. Tables are rendered by
:mod:`mlsys_jax.tables`.
"""
from mlsys_jax.cli.main import main

__all__ = ["main"]
