"""``python -m experiments.s06_frameworks``: this section alone, printed as ``mlsys-jax run`` prints it."""
import experiments
from experiments.s06_frameworks import ID

raise SystemExit(experiments.main([ID]))
