"""Running the sharded step beside one device, step by step, in memory flat in the step count.

One trajectory is followed on one device: the user's step on the whole batch. At each of its
states (teacher forcing) the mesh takes one step from that same state, and

* its loss and gradients must equal the *reference* (what the mesh computes, on one device)
  within the noise of the *twin* (an equivalent one-device computation, same state);
* its new parameters must equal what the one-device optimizer makes of the mesh's own gradients
  (so optax ran on global arrays: a per-shard global-norm clip would show here).

Then the mesh runs free from its own state; its loss and gradients per step and its parameters at
the end are compared with the one-device trajectory (``free``): drift, not the verdict (Adam
turns rounding noise in a gradient that is mathematically zero into a step of up to the learning
rate). Only the current states are held — one device's, the mesh's (second pass), and each step's
transients, dropped as soon as they are judged — so memory stays flat in the step count.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import jax
import numpy as np

from mlsys_jax.parallel.shard.compare import Judgement, host, leaf_diffs, leaf_scales
from mlsys_jax.parallel.shard.semantics import arrangement
from mlsys_jax.parallel.shard.step import copier, on_one_device, place, release_memory

QUANTITIES = ("loss", "grads", "params")


@dataclass
class RunFigures:
    """What the steps showed."""

    forced: dict = field(default_factory=lambda: {q: Judgement() for q in QUANTITIES})
    free: dict = field(default_factory=lambda: dict.fromkeys(QUANTITIES, 0.0))
    final_params: object = None      # the mesh's free-running parameters (host), when kept


class Recorder:
    """Writes each step's mesh values to ``directory`` (one ``.npy`` per leaf), for comparing
    runs across processes without holding them: ``forced/<step>/<quantity>/<leaf>.npy`` and
    ``free/...``. Across processes every process gathers the values (a collective), process 0
    writes them."""

    def __init__(self, directory: str | None):
        self.directory = directory

    def __call__(self, kind: str, step: int, quantity: str, tree) -> None:
        if self.directory is None:
            return
        values = [host(x) for x in jax.tree.leaves(tree)]
        if jax.process_index() != 0:
            return
        where = os.path.join(self.directory, kind, str(step), quantity)
        os.makedirs(where, exist_ok=True)
        for i, x in enumerate(values):
            np.save(os.path.join(where, f"{i}.npy"), x)


def compare_recorded(a: str, b: str) -> dict:
    """``{kind: {quantity: max |Δ|}}`` between two recorded runs, leaf by leaf (memory-mapped)."""
    out: dict = {}
    for root, _, files in os.walk(a):
        rel = os.path.relpath(root, a).split(os.sep)
        if len(rel) != 3:
            continue
        kind, _, quantity = rel
        worst = out.setdefault(kind, {}).setdefault(quantity, 0.0)
        for f in files:
            u = np.load(os.path.join(root, f), mmap_mode="r")
            v = np.load(os.path.join(b, *rel, f), mmap_mode="r")
            worst = max(worst, float(np.max(np.abs(u - v), initial=0.0)))
        out[kind][quantity] = worst
    return out


def _progress(what: str, step: int, steps: int, t0: float) -> None:
    if steps >= 5 and (step + 1) % max(1, steps // 10) == 0:
        print(f"mlsys-jax shard: {what} step {step + 1}/{steps} ({time.perf_counter() - t0:.0f} "
              "s)", file=sys.stderr, flush=True)


def run(setup, sem, programs, mesh, steps: int, keep_params: bool = False,
        record: Recorder | None = None) -> RunFigures:
    """``steps`` teacher-forced, then ``steps`` free-running steps of the compiled sharded step
    ``mesh`` (``programs``: the compiled one-device ``value_and_grad`` programs by loss name, the
    optimizer's ``advance`` and its ``init``). The two passes follow the one-device trajectory
    each: the mesh's own state is never held beside the copies a teacher-forced step takes."""
    figures = RunFigures()
    record = record or Recorder(None)
    _forced(setup, sem, programs, mesh, steps, figures.forced, record)
    release_memory()
    mt = _free(setup, programs, mesh, steps, figures.free, record)
    if keep_params:
        figures.final_params = jax.tree.map(host, mt)
    return figures


def _forced(setup, sem, programs, mesh, steps: int, forced: dict, record) -> None:
    lay, eps = setup.layout, setup.eps
    whole, ref, twin = programs["whole"], programs[sem.reference], programs[sem.twin]
    advance = programs["advance"]
    low = arrangement(setup, sem, programs)
    t, b = setup.trainable, setup.batch
    s = programs["init"](t)
    mesh_b = place(b, lay.batch)
    params_to_mesh, state_to_mesh = copier(lay.params), copier(lay.opt_state)
    t0 = time.perf_counter()
    for k in range(steps):
        # the mesh from one device's state (fresh copies, donated to the step), and the
        # one-device optimizer on the mesh's gradients: the largest program runs first, alone,
        # with the last step's freed transients handed back first
        release_memory()
        nt, lm, gm = _without_state(mesh(params_to_mesh(t), state_to_mesh(s), mesh_b))
        want = advance(on_one_device(gm), s, t)[0]   # its new state is not judged: dropped here
        forced["params"].add(leaf_diffs(nt, want), [0.0] * len(jax.tree.leaves(want)),
                             leaf_scales(want), eps)
        record("forced", k, "params", nt)
        del nt, want
        lw, gw = whole(t, b)
        lr, gr = (lw, gw) if ref is whole else ref(t, b)
        lt, gt = twin(t, b)
        noise = (leaf_diffs(lr, lt), leaf_diffs(gr, gt))
        noise, narrow = low.measure((lm, gm), (lr, gr), (lt, gt), noise, t, b)
        del lt, gt
        forced["loss"].add(leaf_diffs(lm, lr), noise[0], leaf_scales(lr), eps, narrow[0])
        forced["grads"].add(leaf_diffs(gm, gr), noise[1], leaf_scales(gr), eps, narrow[1])
        record("forced", k, "loss", lm)
        record("forced", k, "grads", gm)
        del gm, gr
        t, s = advance(gw, s, t)
        del gw
        _progress("teacher-forced", k, steps, t0)


def _without_state(out):
    """A teacher-forced mesh step's parameters, loss and gradients; its new optimizer state is
    dropped at once (a name bound to it would hold it through the next step's mesh call)."""
    nt, _, lm, gm = out
    return nt, lm, gm


def _free(setup, programs, mesh, steps: int, free: dict, record):
    """The mesh from its own state beside the one-device trajectory; returns its parameters."""
    lay = setup.layout
    whole, advance = programs["whole"], programs["advance"]
    t, b = setup.trainable, setup.batch
    s = programs["init"](t)
    mesh_b = place(b, lay.batch)
    mt, ms = copier(lay.params)(t), copier(lay.opt_state)(s)
    t0 = time.perf_counter()
    for k in range(steps):
        release_memory()
        mt, ms, lf, gf = mesh(mt, ms, mesh_b)
        lw, gw = whole(t, b)
        free["loss"] = max(free["loss"], *leaf_diffs(lf, lw))
        free["grads"] = max(free["grads"], *leaf_diffs(gf, gw), 0.0)
        record("free", k, "loss", lf)
        record("free", k, "grads", gf)
        del gf
        t, s = advance(gw, s, t)
        del gw
        _progress("free-running", k, steps, t0)
    free["params"] = max(leaf_diffs(mt, t), default=0.0)
    record("free", steps, "params", mt)
    return mt
