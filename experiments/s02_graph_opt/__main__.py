"""``python -m experiments.s02_graph_opt``: this section alone, printed as ``mlsys-jax run`` prints it."""
import experiments
from experiments.s02_graph_opt import ID

raise SystemExit(experiments.main([ID]))
