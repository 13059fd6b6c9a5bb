"""The one-device programs a pipeline's steps are judged against, compiled once per loss.

``run_pipeline`` compiles, for every plan, the references (A, B, C: ``verdict.references``),
the optimizer's update and the float64 twin (``verdict.Float64Twin``): seconds of XLA on a
small model, more than the pipeline's own program. Plans of the same loss on the same batch —
one model under 1F1B and GPipe, or another split — need the same programs: they are the
user's step on one device, whatever the schedule or the split. So they are kept, for the last
few plans, under the identity of what they were built from: the user's loss function, the
values it closes over that are not trained, the batch, the optimizer (held here, so an identity
is never another object's), the trained leaves' types, the microbatch count and what else the
programs take. A plan of anything else compiles its own.
"""
from __future__ import annotations

from collections import OrderedDict

import jax

from mlsys_jax.compat import x64_enabled
from mlsys_jax.parallel.pipe.optim import update_function
from mlsys_jax.parallel.pipe.verdict import Float64Twin, references

KEEP = 2  # plans' programs kept (each holds a few compiled executables)
_KEPT: OrderedDict = OrderedDict()


def programs(plan, groups: int, options, *, narrow, random: bool, s0) -> tuple:
    """``(references, update, twin)`` for ``plan`` at ``groups`` microbatches in all (data ×
    microbatches), compiled with ``options``: another plan's, when it was built from the same
    objects (see the module doc), else compiled now."""
    t0 = plan.trainable
    held = jax.tree.leaves((*plan.source, plan.batch, plan.optimizer), is_leaf=callable)
    key = None if not plan.source else (
        tuple(map(id, held)),
        str(jax.tree.structure(t0)), tuple(str(jax.typeof(x)) for x in jax.tree.leaves(t0)),
        groups, tuple(plan.program.shared), repr(sorted((options or {}).items())),
        narrow, random, x64_enabled())
    got = _KEPT.get(key) if key is not None else None
    if got is not None and all(a is b for a, b in zip(got[0], held)):
        _KEPT.move_to_end(key)
        return got[1]
    built = (jax.jit(references(plan.loss, groups, plan.microbatch_loss, plan.program.shared))
             .lower(t0, plan.batch).compile(options),
             jax.jit(update_function(plan.optimizer)).lower(t0, s0, t0).compile(options),
             Float64Twin(plan.loss, t0, plan.batch, groups, options, narrow=narrow,
                         stochastic=random, shared=plan.program.shared))
    if key is not None:
        _KEPT[key] = (held, built)
        while len(_KEPT) > KEEP:
            _KEPT.popitem(last=False)
    return built
