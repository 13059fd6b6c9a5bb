"""A hypothesis strategy over the same program specs (docs/verification.md §2: shrinking for free).

The generator draws every choice through a chooser; this one asks hypothesis, so a failing
example shrinks toward the first option of each choice (listed simplest first), fewer motifs and
no wrappers. Import needs the ``hypothesis`` package (a test dependency).
"""
from __future__ import annotations

from hypothesis import strategies as st

from mlsys_jax.fuzz.spec import Knobs, generate


class HypothesisChooser:
    """Choices drawn from hypothesis ``data``."""

    def __init__(self, draw):
        self.draw = draw

    def choice(self, options):
        """One of ``options``, drawn so that hypothesis shrinks towards the first."""
        return options[self.draw(st.integers(0, len(options) - 1))]

    def integer(self, lo: int, hi: int) -> int:
        """An integer in ``[lo, hi]``, shrinking towards ``lo``."""
        return self.draw(st.integers(lo, hi))

    def chance(self, p: float) -> bool:
        """True with probability ``p``; shrinks to False, so optional features vanish first."""
        # shrinks to 0 -> False: optional features disappear first
        return self.draw(st.integers(0, 999)) >= round(1000 * (1 - p))

    def seed(self) -> int:
        """A seed for a node's own random values."""
        return self.draw(st.integers(0, 2**31 - 2))


@st.composite
def specs(draw, knobs: Knobs | None = None):
    """Random program specs (:class:`mlsys_jax.fuzz.Spec`)."""
    return generate(HypothesisChooser(draw), knobs)
