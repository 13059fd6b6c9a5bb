"""Parameter-shaped values (parameters, gradients) laid out per stage.

Stage s holds, in its *own* buffers, the leaves it owns (whole) and its slices of the leaves cut
by rows; every stage holds the *replicated* leaves in a second set of buffers. Both are
:class:`~mlsys_jax.parallel.pipe.flat.FlatLayout` families padded to one size, stacked over the
``pipe`` axis on the mesh (``[stages, n]`` per dtype), so each device keeps exactly its stage's
parameters plus the padding.

The optimizer sees every leaf on every stage as a *view* (``view_avals``): its own leaves whole,
its rows of a cut leaf, the replicated leaves whole, and another stage's leaf as an empty array
(its leading axis 0, the rest of its shape kept) — the user's tree, structure and ranks intact.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from mlsys_jax.parallel.pipe.flat import FlatLayout, padded_family


def _rows(shape, n) -> tuple:
    return (n,) + tuple(shape[1:])


class StageLeaves:
    """Where every leaf of a parameter-shaped tree sits on each of ``stages`` stages."""

    def __init__(self, leaf_avals, placements, stages: int):
        self.avals, self.placements, self.stages = list(leaf_avals), list(placements), stages
        self.own_entries = []     # per stage: (leaf, lo, hi) with hi - lo rows of the leaf
        for s in range(stages):
            entries = []
            for leaf, (a, p) in enumerate(zip(self.avals, self.placements)):
                if p.kind == "owned" and p.owner == s:
                    entries.append((leaf, 0, a.shape[0]))
                elif p.kind == "rows" and p.rows[s][1] > p.rows[s][0]:
                    entries.append((leaf, *p.rows[s]))
            self.own_entries.append(entries)
        self.rep_leaves = [i for i, p in enumerate(self.placements) if p.kind == "replicated"]
        self.own = padded_family([FlatLayout([self.slice_aval(l, lo, hi) for l, lo, hi in e])
                                  for e in self.own_entries])
        self.rep = FlatLayout([self.avals[i] for i in self.rep_leaves])

    def slice_aval(self, leaf, lo, hi):
        """A leaf's abstract value cut to rows ``lo:hi`` (scalars kept whole)."""
        a = self.avals[leaf]
        return a.update(shape=_rows(a.shape, hi - lo)) if a.shape else a

    def view_avals(self, s: int) -> list:
        """The optimizer's view of every leaf on stage s."""
        out = []
        for a, p in zip(self.avals, self.placements):
            if p.kind == "replicated" or (p.kind == "owned" and p.owner == s):
                out.append(a)
            elif p.kind == "rows":
                out.append(a.update(shape=_rows(a.shape, p.rows[s][1] - p.rows[s][0])))
            else:
                out.append(a.update(shape=_rows(a.shape, 0)))
        return out

    def views(self, s: int, own: dict, rep: dict, empty=None) -> list:
        """Traced: every leaf's view on stage s from its buffers; another stage's leaf is
        ``empty(aval)`` if given, else an empty array."""
        mine = dict(zip([l for l, _, _ in self.own_entries[s]], self.own[s].unpack(own)))
        mine.update(zip(self.rep_leaves, self.rep.unpack(rep)))
        make = empty or (lambda a: jnp.zeros(a.shape, a.dtype))
        return [mine[i] if i in mine else make(a) for i, a in enumerate(self.view_avals(s))]

    def pack_views(self, s: int, views) -> tuple[dict, dict]:
        """Traced: stage s's buffers from views of every leaf (the inverse of :meth:`views`)."""
        return (self.own[s].pack([views[l] for l, _, _ in self.own_entries[s]]),
                self.rep.pack([views[i] for i in self.rep_leaves]))

    def pack_some(self, s: int, values: dict) -> tuple[dict, dict]:
        """Traced: buffers holding ``{leaf: value}`` (as stage s holds it), zeros elsewhere."""
        def pick(leaf, aval):
            return values[leaf] if leaf in values else jnp.zeros(aval.shape, aval.dtype)
        own = [pick(l, self.slice_aval(l, lo, hi)) for l, lo, hi in self.own_entries[s]]
        return self.own[s].pack(own), self.rep.pack([pick(i, self.avals[i])
                                                      for i in self.rep_leaves])

    def read(self, s: int, leaves, own: dict, rep: dict) -> list:
        """Traced: the values of ``leaves`` as stage s's forward reads them."""
        mine = dict(zip([l for l, _, _ in self.own_entries[s]], self.own[s].unpack(own)))
        mine.update(zip(self.rep_leaves, self.rep.unpack(rep)))
        return [mine[i] for i in leaves]

    def to_host(self, leaves) -> tuple[list[dict], dict]:
        """NumPy: per-stage own buffers and the replicated buffer of a full tree's leaves."""
        leaves = [np.asarray(x) for x in leaves]
        own = [self.own[s].pack_host([leaves[l][lo:hi] if leaves[l].ndim else leaves[l]
                                      for l, lo, hi in self.own_entries[s]])
               for s in range(self.stages)]
        return own, self.rep.pack_host([leaves[i] for i in self.rep_leaves])

    def from_host(self, own: list[dict], rep: dict) -> list:
        """NumPy: the full tree's leaves from per-stage own buffers and one replicated buffer."""
        out: list = [None] * len(self.avals)
        for i, x in zip(self.rep_leaves, self.rep.unpack_host(rep)):
            out[i] = x
        pieces: dict = {}
        for s in range(self.stages):
            for (l, lo, _hi), x in zip(self.own_entries[s], self.own[s].unpack_host(own[s])):
                pieces.setdefault(l, []).append((lo, x))
        for l, parts in pieces.items():
            out[l] = np.concatenate([x for _, x in sorted(parts, key=lambda t: t[0])])
        assert all(x is not None for x in out), "every leaf has an owner or is replicated"
        return out

    def bytes_per_stage(self) -> list[int]:
        """Parameter bytes each stage holds (its own values plus the replicated ones, no padding)."""
        return [self.own[s].nbytes + self.rep.nbytes for s in range(self.stages)]
