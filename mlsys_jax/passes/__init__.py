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
from mlsys_jax.passes.registry import PASSES, pipeline
from mlsys_jax.passes.verify import VerificationError, verify

# every rule's factory (passes/rules/, found by the registry), exported under its name
RULES = tuple(name for name, e in PASSES.items() if e.rule is not None)
globals().update({name: PASSES[name].factory for name in RULES})

__all__ = [*RULES, "cse", "dce", "dce_jaxpr", "fold_constants", "inline", "prune_outputs",
           "FixpointError", "Pass", "PassResult", "Refusal", "Rewrite", "Runner", "chain",
           "fixpoint", "make_pass", "LogEntry", "RunResult", "cost_summary", "run", "pipeline",
           "VerificationError", "verify"]
