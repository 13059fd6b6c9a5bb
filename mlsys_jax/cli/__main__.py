"""``python -m mlsys_jax.cli``: the same as the ``mlsys-jax`` command."""
from mlsys_jax.cli.main import main

raise SystemExit(main())
