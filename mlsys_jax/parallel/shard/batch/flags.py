"""The batch axis through equinox's own primitives (a mixin of ``rules.Rules``), which diffrax's
solvers and ``eqx.error_if`` bind under ``vmap``.

* ``unvmap_any``/``unvmap_all``/``unvmap_max`` reduce over the vmapped examples to one flag or
  count: "is any example still running", "did any fail a check". The flag steers a loop's trip
  count or a branch for the whole batch, and the library is written so that each example's
  values come out as they would alone (finished examples are held by a select; an error branch
  only raises). The walk cannot see that, so the flag is recorded as *unfollowed* (the
  gradients of the whole batch and of the shards decide) and the walk goes on with it free of
  the batch, still finding any mixing after it.
* ``vprim`` is ``jax.vmap`` of a primitive over ``__batch_axes``: per example when the examples
  are the mapped axis of each operand that holds them.
* ``select_if_vmap`` is a select; ``nonbatchable`` passes its operand through.
"""
from __future__ import annotations

from mlsys_jax.parallel.shard.batch.axis import Free, Rows, Stat, Summed

FLAGS = ("unvmap_any", "unvmap_all", "unvmap_max")


def _shape(v) -> tuple:
    return tuple(getattr(v.aval, "shape", ()))


def flag_detail(primitive: str) -> str:
    """The sentence for a batch-wide flag."""
    return (f"a batch-wide flag ({primitive} over the examples) steers a loop or a check for the "
            "whole batch")


class Flags:
    """Mixin of :class:`rules.Rules` (``self.walk``, ``self.elementwise``, ``self.statistic``)."""

    def p_unvmap_any(self, eqn, ins, path):
        if any(isinstance(s, (Rows, Summed, Stat)) for s in ins):
            self.walk.record("unfollowed", eqn, path, flag_detail(eqn.primitive.name))
        return Free()

    p_unvmap_all = p_unvmap_max = p_unvmap_any

    def p_nonbatchable(self, eqn, ins, path):
        return ins[0]

    def p_select_if_vmap(self, eqn, ins, path):
        return self.elementwise(eqn, ins, path)

    def p_vprim(self, eqn, ins, path):
        """``vmap`` of a library primitive: the examples must be each operand's mapped axis."""
        axes = eqn.params.get("__batch_axes", ())
        rows = [s for s in ins if isinstance(s, Rows)]
        n = len(eqn.outvars)
        if len(axes) != len(ins) or any(s != rows[0] for s in rows):
            return [self._vprim_unfollowed(eqn, path)] * n
        for s, a in zip(ins, axes):
            if isinstance(s, Rows) and s.dim != a:
                return [self._vprim_unfollowed(eqn, path)] * n
            if isinstance(s, (Summed, Stat)):
                return [self.statistic(eqn, path, s, s.synced)] * n
            if isinstance(s, Free) and a is not None and a in s.varying and rows:
                return [self.walk.record("position", eqn, path, "each example meets a "
                                         "different slice of a batch-independent operand")] * n
        if not rows:
            return [Free(frozenset(d for d, k in enumerate(_shape(v)) if k > 1))
                    for v in eqn.outvars]
        return [Rows(0, rows[0].inner)] * n

    def _vprim_unfollowed(self, eqn, path):
        what = getattr(eqn.params.get("prim"), "name", "a primitive")
        return self.walk.record("unfollowed", eqn, path, f"vmap of {what} whose mapped axis is "
                                "not the batch axis of every operand holding examples")
