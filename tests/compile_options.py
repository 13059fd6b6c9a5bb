"""XLA options the tests compile with where a test passes its own (one definition for all).

``FAST_COMPILE``: ``comm.QUICK_COMPILE`` (the commands' ``--quick-compile``) with XLA:CPU's
elemental emitters instead of its fusion emitters: the same computations, compiled in about half
the time. A run given these compiles every program of it (the mesh's or pipeline's, the one-device
references and the twin alike) with them, so its verdict compares like with like.
"""
from mlsys_jax.parallel.comm import QUICK_COMPILE

FAST_COMPILE = {**QUICK_COMPILE, "xla_cpu_use_fusion_emitters": False}
