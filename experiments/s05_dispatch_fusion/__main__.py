"""``python -m experiments.s05_dispatch_fusion``: this section alone, printed as ``mlsys-jax run`` prints it."""
import experiments
from experiments.s05_dispatch_fusion import ID

raise SystemExit(experiments.main([ID]))
