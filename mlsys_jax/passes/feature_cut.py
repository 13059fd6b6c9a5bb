"""Translation validation on a cut of a linear site's output features, where its weights are large.

A rewrite of a factory's 512 MiB kernel would be validated by running that kernel — in float64,
a 1 GiB copy — on every draw, on both sides. But each output feature of a conv or ``dot_general``
reads only its own slice of the weights, and the per-feature ops a fold removes read only that
feature's constants. So where the site's weights are large, the region and its replacement run on
``KEEP`` of its output features along one axis: the first two, the last two (where an
off-by-one lands) and a seeded sample of the rest (``keep``). The kernel is sliced along its
output-feature axis; full-size constants after it are sliced alike as each equation binds
(``ir.rebatch``'s ``picks``), and the rule's own per-feature vectors through ``Emit.features``.
``ir.rebatch`` raises where an equation could mix the features (a reduction or contraction over
them, a reshape that regroups them, a grouped conv), and validation then runs whole.

What a cut proves: on the kept features, every element of the region's outputs agrees with the
replacement's, as whole-region validation judges it (docs/verification.md §1); it says nothing
about the other features, which ``optimize``'s value check still compares element by element.
It relies on the rule computing each feature of its replacement from that feature's values only,
as the fold algebra does (``rewrite/linear.py``); a replacement that cannot run on the cut is
validated whole. Every log line of a rewrite validated so says so (:meth:`Cut.describe`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlsys_jax.ir import aval_bytes

CUT_ABOVE = 1 << 22   # bytes of a site's weights from which its region runs on a cut
KEEP = 64             # output features kept: the first two, the last two and a seeded sample
EDGES = 2             # kept at each end


@dataclass(frozen=True)
class Site:
    """What a region says about the linear site it rewrites (``rules/linear.LinearSite``): its
    weights, the weight axes that own its output features, the feature axes' sizes, those of
    them a cut may slice (none for a grouped conv or a dot's batch axes), a conv_bias call's
    bias (feature-shaped), if any, and the value the weights are applied to (``operand``)."""

    weight: object
    weight_axes: tuple
    sizes: tuple
    cuttable: tuple
    bias: object = None
    operand: object = None


@dataclass(frozen=True)
class Cut:
    """Output features ``keep`` (sorted) of ``size`` along feature axis ``axis`` of ``site``."""

    site: Site
    axis: int
    keep: np.ndarray
    size: int

    @property
    def picks(self) -> dict:
        """For ``ir.rebatch``: an axis of ``size`` cut to ``len(keep)`` keeps ``keep``."""
        return {(self.size, len(self.keep)): self.keep}

    def vector(self, v):
        """A feature-shaped value (axes in the site's features order) at the kept features."""
        return np.take(np.asarray(v), self.keep, axis=self.axis)

    def constant(self, var, value):
        """``value`` of ``var`` as the cut reads it: the weights and the bias cut, others whole."""
        if var is self.site.weight:
            return np.take(np.asarray(value), self.keep, axis=self.site.weight_axes[self.axis])
        if var is self.site.bias:
            return self.vector(value)
        return value

    def shape(self, var, shape: tuple) -> tuple:
        """The shape an input ``var`` is drawn at (traced weights or bias are cut too)."""
        axis = self.site.weight_axes[self.axis] if var is self.site.weight else \
            self.axis if var is self.site.bias else None
        if axis is None or shape[axis] != self.size:
            return shape
        return shape[:axis] + (len(self.keep),) + shape[axis + 1:]

    def describe(self) -> str:
        drawn = len(self.keep) - 2 * EDGES
        return (f"{len(self.keep)} of its {self.size} output features (the first {EDGES}, the "
                f"last {EDGES} and {drawn} drawn with seed {self.size})")


def keep(size: int, count: int = KEEP) -> np.ndarray:
    """``count`` of ``size`` feature indices: both ends and a sample seeded by ``size`` (the same
    cut for the same site, so a refusal reproduces)."""
    ends = np.r_[0:EDGES, size - EDGES:size]
    middle = np.random.default_rng(size).choice(np.arange(EDGES, size - EDGES),
                                                count - 2 * EDGES, replace=False)
    return np.unique(np.concatenate([ends, middle]))


def choose(site: Site | None) -> Cut | None:
    """The cut a region with ``site`` is validated on, or None (no site, small weights, or no
    feature axis longer than ``KEEP`` that may be cut)."""
    if site is None or aval_bytes(site.weight.aval) < CUT_ABOVE:
        return None
    axes = [j for j in site.cuttable if site.sizes[j] > KEEP]
    if not axes:
        return None
    j = max(axes, key=lambda a: site.sizes[a])
    return Cut(site, j, keep(site.sizes[j]), site.sizes[j])
