"""The lecture's roofline cost model (hardware as data, per-primitive rules, kernels, liveness)
and ``here``, a measured-operator model of the backend JAX runs on (``cost/here/``)."""
from mlsys_jax.cost.hardware import HARDWARE, Hardware, cpu_hardware, get_hardware
from mlsys_jax.cost.here import OperatorModel, here_hardware  # registers --hw here
from mlsys_jax.cost.liveness import Liveness, liveness
from mlsys_jax.cost.model import (Cost, CostReport, Kernel, aval_bytes, eqn_cost, eqn_flops,
                                  estimate, kernels)
from mlsys_jax.cost.flop_rules import FLOP_RULES, known

__all__ = ["HARDWARE", "Hardware", "cpu_hardware", "get_hardware", "OperatorModel",
           "here_hardware", "Liveness", "liveness", "Cost",
           "CostReport", "Kernel", "aval_bytes", "eqn_cost", "eqn_flops", "estimate", "kernels",
           "FLOP_RULES", "known"]
