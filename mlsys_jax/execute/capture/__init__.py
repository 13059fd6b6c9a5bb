"""Graph-break capture (lecture §8.4, PyTorch 2's Dynamo): ``capture(fn)`` and ``explain(fn, ...)``.

The files, in the order a call meets them:

- ``captured.py``: :class:`Captured` — a call's input key, the guards checked first, the warm
  paths (the settled tree's one program, or a walk of the guard tree) and the cold run.
- ``recording.py``: the custom JAX trace whose tracers defer every primitive and break the graph
  where Python asks for a concrete value.
- ``reads.py``, ``effects.py``: what a cold run's Python reads and changes outside its arguments
  (watched with ``sys.settrace``), and the calls that act on the world; ``process_state.py``:
  the environment, context variables, thread-local data, caches and C buffers a read reaches;
  ``state_guards.py``: the guards on those reads, checked before each warm call.
- ``guard_tree.py``: segments, breaks and the tree of recorded paths a cold run fills.
- ``break_guards.py``: the key of what Python received at a break, and how a replay checks it on
  the device.
- ``exact_programs.py``, ``dispatch_units.py``: compiling a segment so that it rounds as eager
  JAX does, and which dispatches run as their own program.
- ``one_program.py``: the guard tree below a break replayed as one compiled program.
- ``explanation.py``: ``explain`` and its report.
"""
from __future__ import annotations

from mlsys_jax.execute.capture.captured import MAX_SIGNATURES, Captured, capture
from mlsys_jax.execute.capture.explanation import ExplainOutput, explain
from mlsys_jax.execute.capture.guard_tree import BreakReason

__all__ = ["MAX_SIGNATURES", "BreakReason", "Captured", "ExplainOutput", "capture", "explain"]
