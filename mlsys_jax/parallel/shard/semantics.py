"""What the sharded step computes, and the one-device computations it is judged against.

* **global** — the loss is separable: the mesh runs the user's loss as one global program
  (``jax.jit`` partitions it); the reference is one device on the whole batch, the *twin* (a
  second, mathematically equal computation that measures the rounding noise) the mean of the
  per-shard losses.
* **per-shard** — it is not: the mesh runs what data parallelism runs, each shard's loss on its
  own rows (own BatchNorm statistics, own normaliser; PRNG keys folded with the shard index),
  averaged; the reference is that on one device (a vmap over the shards), the twin a loop over
  the shards, one compiled shard at a time, as the mesh's devices run them.
* **synchronised** — the model names an axis (``BatchNorm(axis_name='batch')``) bound to the
  data axis: the mesh runs the loss per shard with the model's collectives over the shards
  (``sync.on_mesh``); on one device the name binds to a vmap over the shards. When that makes the
  loss equal the whole batch's (synchronised BatchNorm), the reference is the whole batch.

With a single data shard (a model-only mesh) the twin is the whole batch with its rows reversed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mlsys_jax.ir.precision import gradient_dtypes, split_sums, ulp
from mlsys_jax.parallel.shard import sync
from mlsys_jax.parallel.shard.compare import Narrow, holds_only, leaf_diffs, leaf_rms_diffs, \
    leaf_rms_scales, leaf_scales
from mlsys_jax.parallel.shard.inputs import shard_shapes
from mlsys_jax.parallel.shard.separability import per_shard_losses, reversed_rows, shards_of


@dataclass(frozen=True)
class StepSemantics:
    """The losses of one sharded run (each ``f(trainable, batch) -> scalar``)."""

    kind: str              # "global", "per-shard" or "synchronised"
    whole: Callable        # one device, whole batch: the trajectory every report compares with
    reference: str         # which one-device loss the mesh must equal: a key of ``losses``
    twin: str              # its equivalent computation (the noise): a key of ``losses``
    mesh: Callable         # what the sharded step differentiates
    losses: dict           # name -> one-device loss
    folded: int            # PRNG keys folded per shard


def one_device_losses(setup) -> tuple[dict, int]:
    """``({"whole", "shards", "shards_reordered", "rows_reversed", "_per"}: loss, folded keys)``:
    one-device losses by name (``_per``: the per-shard losses, ``per_shard_losses``' ``f``)."""
    loss, n, name = setup.loss, setup.data_size, setup.axis_name
    order = list(range(n))[::-1]
    out = {"whole": loss if name is None else sync.whole_batch(loss, name)}
    out["rows_reversed"] = (lambda t, b, f=out["whole"]:
                            f(t, reversed_rows(b, setup.batch_axes)))
    folded = 0
    if n > 1 and name is not None:
        out["shards"] = sync.over_shards(loss, name, shards_of, n)
        out["shards_reordered"] = sync.over_shards(loss, name, shards_of, n, order)
    elif n > 1:
        axes = setup.batch_axes   # (1 for a time-major leaf)
        per, folded = per_shard_losses(loss, setup.trainable, setup.batch, n, axes)
        out["shards"] = lambda t, b: jnp.mean(per(t, shards_of(b, n, axes)))
        out["shards_reordered"] = lambda t, b: jnp.mean(per(t, shards_of(b, n, axes), order))
        out["_per"] = per
    return out, folded


def choose(setup, separable: bool, losses: dict, folded: int, positional: bool) -> StepSemantics:
    """The semantics for a separability verdict (``separable`` is ignored with a single data
    shard; ``positional``: the loss draws masks for batch positions)."""
    layout, n = setup.layout, setup.data_size
    if n == 1:
        twin = "whole" if positional else "rows_reversed"
        return StepSemantics("global", losses["whole"], "whole", twin, setup.loss, losses, 0)
    if setup.axis_name is not None:
        mesh = sync.on_mesh(setup.loss, setup.trainable, shard_shapes(setup.batch, n),
                            setup.axis_name, layout.mesh, layout.data_axis)
        ref, twin = ("whole", "shards") if separable else ("shards", "shards_reordered")
        return StepSemantics("synchronised", losses["whole"], ref, twin, mesh, losses, folded)
    if separable:
        return StepSemantics("global", losses["whole"], "whole", "shards", setup.loss, losses,
                             folded)
    per = losses["_per"]
    on_data = NamedSharding(layout.mesh, P(layout.data_axis))

    def on_mesh(t, b):  # shard i on the data axis' device i
        shards = jax.lax.with_sharding_constraint(shards_of(b, n, setup.batch_axes),
                                                  jax.tree.map(lambda _: on_data, b))
        return jnp.mean(per(t, shards))
    return StepSemantics("per-shard", losses["whole"], "shards", "shards_loop", on_mesh,
                         losses, folded)


@dataclass
class Arrangement:
    """The program's own low-precision rounding, measured at each state. ``dtypes`` (``([loss],
    [each gradient leaf])``): the name of the dtype less precise than float32 (bfloat16,
    float16) each one's computation passes through, or None. Such a leaf's noise also takes its
    difference from ``program``, the reference computed one data shard at a time (each shard's
    loss and gradients compiled alone and rounded in the program's own dtypes, then averaged, as
    the mesh's devices compute them), and its bound the rule of ``compare.Judgement`` for
    narrow leaves: ``reductions`` partial results, one per device, each rounded in that
    dtype."""

    programs: tuple = ()
    dtypes: tuple = ((None,), ())
    how: str = ""
    reductions: int = 1

    @property
    def low(self) -> bool:
        return any(d for ds in self.dtypes for d in ds)

    def measure(self, results: tuple, refs: tuple, twins: tuple, noise: tuple, t, b) -> tuple:
        """``(noise, narrow)`` for the loss and the gradients: each low-precision leaf's noise
        widened by its difference from the arranged computation at this state, and the
        ``compare.Narrow`` figures of its rule (None for both when nothing is narrow)."""
        if not self.low:
            return noise, (None, None)
        rms = [leaf_rms_diffs(r, w) for r, w in zip(refs, twins)]
        noise = [list(ns) for ns in noise]
        for program in self.programs:   # one at a time: each result dropped once measured
            for q, (r, a, ds) in enumerate(zip(refs, program(t, b), self.dtypes)):
                noise[q] = [max(x, y) if d else x for x, y, d in zip(noise[q], leaf_diffs(r, a),
                                                                     ds)]
                rms[q] = [max(x, y) if d else x for x, y, d in zip(rms[q], leaf_rms_diffs(r, a),
                                                                   ds)]
        out_noise, out_narrow = [], []
        for m, r, ns, rs, ds in zip(results, refs, noise, rms, self.dtypes):
            leaves = jax.tree.leaves(r)
            held = [bool(d) and holds_only(x, d) for d, x in zip(ds, leaves)]
            ulps = [ulp(d, s) if h else 0.0 for d, s, h in zip(ds, leaf_scales(r), held)]
            rms_ulps = [ulp(d, s) if h else 0.0 for d, s, h in zip(ds, leaf_rms_scales(r), held)]
            out_noise.append(ns)
            out_narrow.append(Narrow(list(ds), leaf_rms_diffs(m, r), rs,
                                     [int(x.size) for x in leaves], ulps, rms_ulps,
                                     self.reductions))
        return tuple(out_noise), tuple(out_narrow)


def arrangement(setup, sem: StepSemantics, programs) -> Arrangement:
    """How the run measures the program's own low-precision rounding (see :class:`Arrangement`);
    an empty one for a program that computes in float32 or wider throughout."""
    dtypes = gradient_dtypes(sem.losses[sem.reference], setup.trainable, setup.batch,
                             closed=setup.closed)
    out = Arrangement(dtypes=dtypes, reductions=int(setup.layout.mesh.devices.size),
                      how=arrangement_how(setup, sem))
    if not out.low:
        return out
    if _arranged(setup, sem):
        out.programs += (programs["shards_loop"],)
    if _model_size(setup) > 1:
        out.programs += (_split_features(sem.losses[sem.reference], setup, programs),)
    return out


def _model_size(setup) -> int:
    return int(dict(setup.layout.mesh.shape).get("model", 1))


def _split_features(loss, setup, programs):
    """The reference with its narrow contractions split over the model axis' size
    (``ir.precision.split_sums``), compiled as the run's other programs are."""
    from mlsys_jax.parallel.shard.step import value_and_grad

    t, b = setup.trainable, setup.batch
    closed = jax.make_jaxpr(loss)(t, b)
    split = split_sums(closed, _model_size(setup))
    options = getattr(programs, "options", None)
    return value_and_grad(lambda t, b: split(*jax.tree.leaves((t, b)))[0], t, b, options)


def _arranged(setup, sem: StepSemantics) -> bool:
    """The reference has a one-shard-at-a-time computation beside its twin: data shards, the
    per-shard losses defined, no PRNG key folded per shard (that would be other mathematics),
    and a twin that is not that computation already."""
    return (setup.data_size > 1 and "_per" in sem.losses and sem.folded == 0
            and sem.twin != "shards_loop")


def arrangement_how(setup, sem: StepSemantics) -> str:
    """What measures a narrow dtype's rounding besides the twin, in words ("" if nothing)."""
    out = ["the same step computed one data shard at a time"] if _arranged(setup, sem) else []
    if _model_size(setup) > 1:
        out.append(f"the same step with each narrow matmul summed from {_model_size(setup)} "
                   "partial products, as the model axis splits them")
    return ", and of ".join(out)
