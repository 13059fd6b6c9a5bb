"""``--hw here``: a measured-operator model of the backend JAX runs on (TASO measures each
operator on the device once and caches it; the roofline stays the lecture's model).

- ``programs.py``: a kernel of the fused model as a program of its own, and its cache key;
- ``operators.py``: :class:`OperatorModel` — kernels compiled and timed alone, cached on disk
  (``cost/cache.py``), within a time budget, and a program's prediction from its kernels;
- ``rounds.py``: compiling them several at once, and timing rounds that stop where decided;
- ``graphs.py``: the runs of kernels XLA compiles as one graph (YNNPACK), timed as that graph;
- ``dispatch.py``: what a jit call and each kernel inside a program cost besides the work;
- ``device.py``: ``here`` as a :class:`~mlsys_jax.cost.hardware.Hardware` whose roofline is
  the device's own (the bound each measured kernel is set against).
"""
from mlsys_jax.cost.here.device import here_hardware
from mlsys_jax.cost.here.operators import OperatorModel, operator_model

__all__ = ["here_hardware", "OperatorModel", "operator_model"]
