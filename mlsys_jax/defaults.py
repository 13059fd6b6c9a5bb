"""Defaults that ``--help`` prints, in a module that imports nothing.

``mlsys-jax COMMAND --help`` builds every option's help without starting JAX
(tests/cli/test_help.py), and the packages these numbers belong to import JAX when they load
(``mlsys_jax.cost`` does, for ``here``); they import them from here instead.
"""

MEASURE_BUDGET_S = 120.0  # ``here``: seconds a command spends measuring kernels it has not seen
