"""The batch axis through scatters (a mixin of ``rules.Rules``): ``x.at[i].set(v)``, ``.add``,
``.mul``, ``.min``, ``.max``.

A scatter keeps the examples apart when it writes each example's update into that example's own
rows: the batch axis of the operand is a window dimension the updates cover whole (a Runge-Kutta
solver storing its stages, ``ks.at[:, j].set(k)`` under ``vmap``), or an operand batching
dimension matched by the indices' and the updates' batch. Writing at positions chosen along the
batch axis, or a window that covers part of it, selects rows.
"""
from __future__ import annotations

from mlsys_jax.parallel.shard.batch.axis import Free, Rows, Stat, Summed


def _shape(v) -> tuple:
    return tuple(getattr(v.aval, "shape", ()))


class _Dims:
    """A scatter's dimension numbers as maps between operand, update and index dimensions."""

    def __init__(self, eqn):
        dn = eqn.params["dimension_numbers"]
        self.operand, self.indices, self.updates = (_shape(v) for v in eqn.invars[:3])
        rank = len(self.operand)
        self.window = [d for d in range(rank) if d not in dn.inserted_window_dims
                       and d not in dn.operand_batching_dims]          # operand window dims
        self.update_window = [int(d) for d in dn.update_window_dims]
        self.update_scatter = [d for d in range(len(self.updates))
                               if d not in self.update_window]          # <-> index dims
        self.batching = [int(d) for d in dn.operand_batching_dims]
        self.index_batching = [int(d) for d in dn.scatter_indices_batching_dims]
        self.targets = {int(d) for d in dn.scatter_dims_to_operand_dims} | \
            {int(d) for d in dn.inserted_window_dims}

    def update_dim(self, d: int):
        """The updates' dimension feeding operand dimension ``d`` and the index dimension
        matching it (None for a window dimension); None when indices choose along ``d``."""
        if d in self.targets:
            return None
        if d in self.batching:
            k = self.index_batching[self.batching.index(d)]
            return self.update_scatter[k], k
        return self.update_window[self.window.index(d)], None

    def operand_dim(self, u: int):
        """The operand dimension fed by updates' dimension ``u`` (None: a scattered one)."""
        if u in self.update_window:
            return self.window[self.update_window.index(u)]
        k = self.update_scatter.index(u)
        return self.batching[self.index_batching.index(k)] if k in self.index_batching else None


class Scatters:
    """Mixin of :class:`rules.Rules` (``self.walk``, ``self.statistic``)."""

    def p_scatter_add(self, eqn, ins, path):
        operand, indices, updates = ins[:3]
        if all(isinstance(s, Free) for s in (operand, indices, updates)):
            return Free(operand.varying | updates.varying)
        if any(isinstance(s, (Summed, Stat)) for s in (operand, indices, updates)):
            return self._scatter_summary(eqn, path, operand, indices, updates)
        dims = _Dims(eqn)
        rows = operand if isinstance(operand, Rows) else None
        if rows is None and isinstance(updates, Rows):
            d = dims.operand_dim(updates.dim)
            if d is None:
                return self.walk.record("selection", eqn, path, "examples are scattered to "
                                        "positions the indices choose")
            rows = Rows(d, updates.inner)
        return self._scatter_rows(eqn, path, dims, rows, operand, indices, updates)

    p_scatter = p_scatter_mul = p_scatter_min = p_scatter_max = p_scatter_add

    def _scatter_rows(self, eqn, path, dims: _Dims, rows: Rows, operand, indices, updates):
        got = dims.update_dim(rows.dim)
        if got is None:
            return self.walk.record("selection", eqn, path, "a scatter writes at positions "
                                    "chosen along the batch axis")
        u, k = got
        if isinstance(operand, Free) and rows.dim in operand.varying:
            return self.walk.record("position", eqn, path, "examples are written into values "
                                    "that vary along the batch axis but do not come from it")
        if k is None and isinstance(indices, Rows):
            return self.walk.record("unfollowed", eqn, path, "a scatter's indices hold examples")
        if not _matches(updates, u, rows) or not _matches(indices, k, rows):
            return self.walk.record("pairs", eqn, path, "a scatter writes one example's values "
                                    "into another's rows")
        if k is None and dims.updates[u] != dims.operand[rows.dim]:
            return self.walk.record("selection", eqn, path, "a scatter overwrites some rows")
        return rows

    def _scatter_summary(self, eqn, path, operand, indices, updates):
        if isinstance(indices, (Summed, Stat)):
            return self.walk.record("selection", eqn, path, "a scatter writes where a "
                                    "batch-wide value says")
        summary = next(s for s in (operand, updates) if isinstance(s, (Summed, Stat)))
        if any(isinstance(s, Rows) for s in (operand, indices, updates)):
            return self.statistic(eqn, path, summary, False)
        return summary


def _matches(state, dim, rows: Rows) -> bool:
    """``state`` holds the same examples along ``dim`` (a free value must be uniform there; any
    value when ``dim`` is None, but rows must not come from elsewhere)."""
    if isinstance(state, Free):
        return dim is None or dim not in state.varying
    return dim is not None and state == Rows(dim, rows.inner)
