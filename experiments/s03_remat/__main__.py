"""``python -m experiments.s03_remat``: this section alone, printed as ``mlsys-jax run`` prints it."""
import experiments
from experiments.s03_remat import ID

raise SystemExit(experiments.main([ID]))
