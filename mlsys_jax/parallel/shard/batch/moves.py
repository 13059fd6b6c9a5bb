"""The batch axis through data movement, random keys, collectives and control flow (the second
half of ``batch_rules.Rules``): slices, gathers and concatenations keep the examples apart unless
they cut, pick or pad along the batch axis. Loops and branches are ``loops.py``.
"""
from __future__ import annotations

from dataclasses import replace
from numbers import Integral

from mlsys_jax.parallel.shard.batch.axis import Free, Mixed, Rows, Stat, Summed
from mlsys_jax.parallel.shard.batch.loops import Loops


def _shape(v) -> tuple:
    return tuple(getattr(v.aval, "shape", ()))


def _reduced_free(s: Free, axes: tuple) -> Free:
    """A free value with dimensions ``axes`` reduced away: the others renumbered."""
    return Free(frozenset(d - sum(a < d for a in axes) for d in s.varying if d not in axes),
                s.random)


def _rows_at(ins: list):
    return next((s for s in ins if isinstance(s, Rows)), None)


class Moves(Loops):
    """Mixin of :class:`batch_rules.Rules` (``self.walk``, ``self.call``, ``self.statistic``);
    control flow is :class:`loops.Loops`."""

    def _summary(self, ins: list):
        """A batch-wide sum or statistic among the inputs, moved around as a whole."""
        return next((s for s in ins if isinstance(s, (Summed, Stat))), None)

    def _select(self, eqn, path: str, what: str):
        return self.walk.record("selection", eqn, path, f"{what} along the batch axis")

    def p_slice(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows):
            d, size = s.dim, _shape(eqn.invars[0])[s.dim]
            p = eqn.params
            stride = (p["strides"] or (1,) * len(p["start_indices"]))[d]
            if (p["start_indices"][d], p["limit_indices"][d], stride) != (0, size, 1):
                return self._select(eqn, path, "rows are sliced")
        return s

    def p_dynamic_slice(self, eqn, ins, path):
        s = ins[0]
        if any(not isinstance(i, Free) for i in ins[1:]):
            return self.walk.record("selection", eqn, path, "a slice starts where the batch says")
        if isinstance(s, Rows) and eqn.params["slice_sizes"][s.dim] != _shape(eqn.invars[0])[s.dim]:
            return self._select(eqn, path, "rows are sliced")
        return s

    def p_dynamic_update_slice(self, eqn, ins, path):
        operand, update = ins[:2]
        if any(not isinstance(i, Free) for i in ins[2:]):
            return self.walk.record("selection", eqn, path, "an update lands where the batch says")
        r = _rows_at([operand, update])
        if r is None:
            return self._summary([operand, update]) or Free(operand.varying | update.varying)
        if operand != update and not isinstance(operand, Free) and not isinstance(update, Free):
            return self.walk.record("pairs", eqn, path, "rows of one value are written into rows "
                                    "of another")
        if _shape(eqn.invars[1])[r.dim] != _shape(eqn.invars[0])[r.dim]:
            return self._select(eqn, path, "some rows are overwritten")
        return r

    def p_concatenate(self, eqn, ins, path):
        r = _rows_at(ins)
        if r is None:
            return self._summary(ins) or Free(frozenset().union(*(s.varying for s in ins)))
        d = eqn.params["dimension"]
        if r.dim == d or any(isinstance(s, Rows) and s != r for s in ins):
            return self._select(eqn, path, "rows are concatenated")
        if any(isinstance(s, (Summed, Stat)) for s in ins):
            return self.statistic(eqn, path, self._summary(ins), False)
        return r

    def p_stack(self, eqn, ins, path):
        r = _rows_at(ins)
        if r is None:
            return self._summary(ins) or Free(frozenset(range(len(_shape(eqn.outvars[0])))))
        if any(isinstance(s, Rows) and s != r for s in ins):
            return self.walk.record("pairs", eqn, path, "rows of different values are stacked")
        if any(isinstance(s, (Summed, Stat)) for s in ins):
            return self.statistic(eqn, path, self._summary(ins), False)
        axis = eqn.params["axis"]
        return Rows(r.dim + (r.dim >= axis), r.inner)

    def p_pad(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows) and tuple(eqn.params["padding_config"][s.dim]) != (0, 0, 0):
            return self._select(eqn, path, "rows are padded")
        return s

    def p_bitcast_convert_type(self, eqn, ins, path):
        s = ins[0]   # a width change adds or drops a last dimension; leading dimensions stay
        if isinstance(s, Rows) and s.dim >= len(_shape(eqn.outvars[0])):
            return self.walk.record("unfollowed", eqn, path, "a bitcast folds the batch axis")
        return s

    def p_rev(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows) and s.dim in eqn.params["dimensions"]:
            return self.walk.record("order", eqn, path, "the rows are reversed")
        return s

    def p_split(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows) and s.dim == eqn.params["axis"]:
            return [self._select(eqn, path, "rows are split")] * len(eqn.outvars)
        return [s] * len(eqn.outvars)

    def p_sort(self, eqn, ins, path):
        r = _rows_at(ins)
        if r is None:
            return [self._summary(ins) or Free(frozenset(range(len(_shape(v)))))
                    for v in eqn.outvars]
        if r.dim == eqn.params["dimension"] or any(isinstance(s, Rows) and s != r for s in ins):
            return [self.walk.record("order", eqn, path, "the rows are sorted")] * len(eqn.outvars)
        return [r] * len(eqn.outvars)

    def p_top_k(self, eqn, ins, path):
        s = ins[0]
        if isinstance(s, Rows) and s.dim == len(_shape(eqn.invars[0])) - 1:
            return [self.walk.record("order", eqn, path, "top_k runs along the batch axis")] * 2
        return [s] * 2

    def p_gather(self, eqn, ins, path):
        operand, indices = ins
        dn, sizes = eqn.params["dimension_numbers"], eqn.params["slice_sizes"]
        out_rank, op_shape = len(_shape(eqn.outvars[0])), _shape(eqn.invars[0])
        from_indices = [i for i in range(out_rank) if i not in dn.offset_dims]
        offset_src = [d for d in range(len(op_shape)) if d not in dn.collapsed_slice_dims
                      and d not in dn.operand_batching_dims]
        if isinstance(indices, (Summed, Stat)):
            return self.walk.record("selection", eqn, path, "rows are picked by a batch-wide value")
        if isinstance(operand, (Summed, Stat)):
            if isinstance(indices, Rows):
                return self.statistic(eqn, path, operand, operand.synced)
            return operand
        if isinstance(operand, Rows):
            d = operand.dim
            if d in dn.start_index_map:
                return self._select(eqn, path, "rows are gathered by index")
            if d in dn.operand_batching_dims:
                k = dn.start_indices_batching_dims[dn.operand_batching_dims.index(d)]
                if isinstance(indices, Rows) and indices != Rows(k, operand.inner):
                    return self.walk.record("pairs", eqn, path, "a gather pairs examples")
                if isinstance(indices, Free) and k in indices.varying:
                    return self.walk.record("position", eqn, path, "each example is indexed by "
                                            "a position-dependent batch-independent index")
                return Rows(from_indices[k], operand.inner)
            if sizes[d] != op_shape[d] or isinstance(indices, Rows):
                return self._select(eqn, path, "rows are gathered")
            return Rows(dn.offset_dims[offset_src.index(d)], operand.inner)
        k = indices.dim
        if k == len(_shape(eqn.invars[1])) - 1:
            return self.walk.record("unfollowed", eqn, path, "the batch runs along a gather's "
                                    "index vector")
        return Rows(from_indices[k], indices.inner)

    def keys(self, eqn, ins: list, path: str):
        """PRNG key plumbing and bits: keys of the batch keep its rows (one key per example)."""
        r = _rows_at(ins)
        if r is not None and all(isinstance(s, Free) or s == r for s in ins):
            return r
        if any(isinstance(s, (Summed, Stat, Rows)) for s in ins):
            return self.walk.record("unfollowed", eqn, path, "random keys mix the batch")
        return Free(frozenset(range(len(_shape(eqn.outvars[0])))), True)

    def p_psum(self, eqn, ins, path):
        """A collective over named axes, and over positional ones: ``vmap(..., axis_name=)``
        turns a collective over the vmapped name into the same primitive over an array
        dimension (equinox's BatchNorm: ``psum`` with ``axes=(0,)``), a reduction like
        ``reduce_sum``/``reduce_max``, which sums the examples when it runs along the batch."""
        positional = tuple(int(a) for a in eqn.params["axes"] if isinstance(a, Integral))
        if positional:
            linear = eqn.primitive.name in ("psum", "psum_invariant")
            ins = [_reduced_free(s, positional) if isinstance(s, Free) else
                   self.reduce(eqn, s, path, linear=linear, axes=positional) for s in ins]
        axes = tuple(a for a in eqn.params["axes"] if isinstance(a, str))
        out = []
        for s in ins:
            if isinstance(s, Mixed):
                out.append(s)
            elif isinstance(s, (Summed, Stat)) and axes and set(axes) <= set(self.synced):
                out.append(replace(s, synced=True))
            elif isinstance(s, Rows):
                out.append(self.walk.record("unfollowed", eqn, path, "a collective sums "
                                            "per-example values across devices"))
            else:
                out.append(s)
        return out

    p_pmax = p_pmin = p_psum_invariant = p_psum


