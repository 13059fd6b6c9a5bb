"""Graph optimizations as verified jaxpr passes (lecture §4): each pass a pure ClosedJaxpr → PassResult.

    p = chain(fold_constants(), cse(), fold_conv_bn(), merge_parallel_convs(), dce())
    p = pipeline("fold_constants,cse,fold_conv_bn,merge_parallel_convs,dce")  # the same, by name
    result = run(p, ir.trace(f, x))   # verified after every pass, every rewrite validated
    result.jaxpr, result.log
"""
from mlsys_jax.passes.basic import cse, dce, dce_jaxpr, fold_constants, inline, prune_outputs
from mlsys_jax.passes.core import (FixpointError, Pass, PassResult, Refusal, Rewrite, Runner,
                                   chain, fixpoint, make_pass)
from mlsys_jax.passes.manager import LogEntry, RunResult, cost_summary, run
from mlsys_jax.passes.registry import pipeline
from mlsys_jax.passes.rules.enlarge_conv_kernel import enlarge_conv_kernel
from mlsys_jax.passes.rules.fold_conv_bn import fold_conv_bn
from mlsys_jax.passes.rules.merge_parallel_convs import merge_parallel_convs
from mlsys_jax.passes.verify import VerificationError, verify

__all__ = ["enlarge_conv_kernel", "fold_conv_bn", "merge_parallel_convs", "cse", "dce",
           "dce_jaxpr", "fold_constants", "inline", "prune_outputs", "FixpointError", "Pass",
           "PassResult", "Refusal", "Rewrite", "Runner", "chain", "fixpoint", "make_pass",
           "LogEntry", "RunResult", "cost_summary", "run", "pipeline", "VerificationError",
           "verify"]
