"""One module per ``mlsys-jax`` command (``run``, ``inspect``, ``optimize``, ``bench``, ``fuzz``,
``remat``, ``shard``, ``plan``; ``shard_pipe`` is ``shard``'s pipeline path). Each has ``HELP``,
``add_arguments(p)`` and ``main(args)``, calls the library and formats its result; the helpers
they share (loading a user's function, rendering) are the modules of :mod:`mlsys_jax.cli`."""

__all__ = ["run", "inspect", "optimize", "bench", "fuzz", "remat", "shard", "shard_pipe", "plan"]
