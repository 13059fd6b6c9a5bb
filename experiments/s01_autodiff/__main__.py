"""``python -m experiments.s01_autodiff``: this section alone, printed as ``mlsys-jax run`` prints it."""
import experiments
from experiments.s01_autodiff import ID

raise SystemExit(experiments.main([ID]))
