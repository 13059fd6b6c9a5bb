"""``python -m experiments.s04_parallel``: this section alone, printed as ``mlsys-jax run`` prints it."""
import experiments
from experiments.s04_parallel import ID

raise SystemExit(experiments.main([ID]))
