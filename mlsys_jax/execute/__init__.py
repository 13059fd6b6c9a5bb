"""Execution models (lecture §3, §8): graph executor, tape AD, graph-break capture.

- ``executor``: ``run(graph, fetches, feed)`` — partial execution, refcount frees, stats;
  ``make_graph`` / ``grad_graph`` (graph-mode AD: the gradient is a graph).
- ``tape``: an eager ``Tensor`` recording ``jax.vjp`` closures; ``backward()`` replays them.
- ``capture/``: ``capture(fn)`` / ``explain(fn, *args)`` — graph breaks and guarded replay
  (the subpackage's ``__init__`` lists its files).
"""
from __future__ import annotations

from mlsys_jax.execute.capture import BreakReason, Captured, ExplainOutput, capture, explain
from mlsys_jax.execute.executor import (ExecStats, Fetched, Graph, grad_graph, make_graph,
                                        needed_equations, run)
from mlsys_jax.execute.tape import COUNTER, Tensor, all_input_grads, apply, backward

__all__ = ["BreakReason", "Captured", "ExplainOutput", "capture", "explain", "ExecStats", "Graph",
           "Fetched", "grad_graph", "make_graph", "needed_equations", "run", "COUNTER", "Tensor",
           "all_input_grads", "apply", "backward"]
