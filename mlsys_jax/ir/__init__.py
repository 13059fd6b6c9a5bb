"""The jaxpr is our computation graph: trace, walk, edit, rebuild (by re-tracing), op view, hash,
DOT.

``ir.primitives`` is the one table of primitive classes; ``ir.walk`` the one walk into nested
bodies and path format; ``ir.keys`` the one structural key; ``ir.edit`` the one way to build a
jaxpr from equation lists; ``ir.evaluate`` the op-by-op evaluator.
"""
from mlsys_jax.ir.dot import to_dot
from mlsys_jax.ir.interpret import as_function, eval_jaxpr, interpret, rebuild
from mlsys_jax.ir.keys import signature, structural_hash
from mlsys_jax.ir.opview import EqnView, Op, op_name, op_view, open_calls
from mlsys_jax.ir.trace import (DTYPES, Traced, aval_bytes, input_structs, is_traced_leaf,
                                itemsize, parse_dtype, parse_spec, partition, random_inputs, trace,
                                trace_tree)
from mlsys_jax.ir.walk import Body, bodies, primitive_counts, walk


__all__ = ["to_dot", "as_function", "eval_jaxpr", "interpret", "rebuild", "Op", "op_name",
           "op_view", "EqnView", "open_calls", "is_traced_leaf", "itemsize", "partition", "DTYPES",
           "Traced", "input_structs", "parse_dtype", "parse_spec", "random_inputs", "trace",
           "trace_tree", "primitive_counts", "structural_hash", "walk", "aval_bytes", "Body",
           "bodies", "signature"]
