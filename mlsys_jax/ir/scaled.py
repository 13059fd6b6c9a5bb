"""A float64 product ``W ⊙ v`` kept as its two factors: a fold's weights as validation means them.

Translation validation (``passes/validate.py``) evaluates a fold's replacement in float64, where
its kernel is the program's weights times a float64 scale per output feature: a second copy of
the kernel at twice its bytes, for a product that only scales what the kernel computes. A
contraction reading one operand as a :class:`Scaled` whose vector varies along that operand's
output features alone computes on ``W`` and scales its output (:func:`output_scale`):
``conv(x, W ⊙ v) = conv(x, W) ⊙ v`` in real arithmetic, each output feature reading its own
slice of the kernel; both are float64 roundings of that value. Anything else reads the product,
materialized (``np.asarray``) to the bits the elementwise multiply computes.

>>> import numpy as np
>>> w, v = np.ones((2, 3), np.float32), np.array([[1.0, 2.0, 4.0]])
>>> k = Scaled(w, v)
>>> k.shape, k.dtype
((2, 3), dtype('float64'))
>>> np.asarray(k)[1].tolist()
[1.0, 2.0, 4.0]
"""
from __future__ import annotations

import numpy as np

CONV = "conv_general_dilated"


class Scaled:
    """``base ⊙ vec``: ``vec`` (float64) broadcasts against ``base`` (narrower float weights),
    the product computed in ``vec``'s dtype, each element rounded once."""

    __slots__ = ("base", "vec")

    def __init__(self, base: np.ndarray, vec: np.ndarray):
        if np.ndim(vec) != np.ndim(base):
            raise ValueError(f"the scale has {np.ndim(vec)} axes, the weights {np.ndim(base)}")
        self.base, self.vec = base, vec

    @property
    def shape(self) -> tuple:
        return self.base.shape

    @property
    def ndim(self) -> int:
        return self.base.ndim

    @property
    def dtype(self) -> np.dtype:
        return self.vec.dtype

    def varying(self) -> tuple:
        """The axes along which the scale is not one value."""
        return tuple(a for a, n in enumerate(self.vec.shape) if n != 1)

    def __array__(self, dtype=None, copy=None):
        with np.errstate(over="ignore", invalid="ignore"):
            out = np.multiply(self.base, self.vec, dtype=self.vec.dtype)
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, index):
        return np.asarray(self)[index]


def output_scale(eqn, k: int, w: Scaled, out_ndim: int) -> np.ndarray | None:
    """The vector that scales ``eqn``'s output when its operand ``k`` is ``w`` instead of
    ``w.base`` (shaped to broadcast against the output), or None where ``w``'s scale varies along
    an axis that is not one of that operand's output features (a contracted, batch or spatial
    axis: the product does not factor out)."""
    name, p = eqn.primitive.name, eqn.params
    if name == CONV:
        if k != 1 or p["batch_group_count"] != 1:
            return None
        dn = p["dimension_numbers"]
        free, places = (dn.rhs_spec[0],), (dn.out_spec[1],)
    elif name == "dot_general":
        (lc, rc), (lb, rb) = p["dimension_numbers"]
        contracted, batch = (lc, rc)[k], (lb, rb)[k]
        free = tuple(a for a in range(w.ndim) if a not in contracted and a not in batch)
        # the output: batch axes, the lhs's free axes, the rhs's
        start = len(lb) + (out_ndim - len(lb) - len(free) if k else 0)
        places = tuple(range(start, start + len(free)))
    else:
        return None
    if not set(w.varying()) <= set(free):
        return None
    shape = [1] * out_ndim
    for a, place in zip(free, places):
        shape[place] = w.vec.shape[a]
    return w.vec.reshape(shape)  # the free axes keep their order in the output
