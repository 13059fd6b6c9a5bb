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

The one-device trajectory is computed once: the teacher-forced pass writes each step's loss and
gradients to disk (:class:`Trajectory`) and keeps the final parameters, and the free-running
pass reads them back instead of running the same programs on the same states again (where the
disk cannot hold them, it recomputes them).
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
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
            worst = max(worst, *leaf_diffs([u], [v]))  # (a NaN on one side: Inf, kept)
        out[kind][quantity] = worst
    return out


class _OnDisk:
    """Arrays in a temporary directory, one ``.npy`` per leaf, written shard by shard (no host
    copy of a whole sharded array) and read back memory-mapped. ``directory`` is None where the
    disk cannot hold ``need`` bytes with room to spare: then nothing is kept. Not flushed: this
    process alone reads the files, through the page cache it wrote them to, and deletes them
    (forcing each write to disk cost GPT-2 small's run seconds: docs/shard.md)."""

    def __init__(self, need: int, prefix: str):
        room = shutil.disk_usage(tempfile.gettempdir()).free
        self.directory = tempfile.mkdtemp(prefix=prefix) if 2 * need < room else None
        self.dtypes: dict = {}     # name -> its leaves' dtypes (bfloat16 reads back as raw
        #                            bytes from .npy)

    def close(self) -> None:
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _save(self, name: str, leaves: list) -> None:
        where = os.path.join(self.directory, name)
        os.makedirs(where)
        for i, x in enumerate(leaves):
            out = np.lib.format.open_memmap(os.path.join(where, f"{i}.npy"), mode="w+",
                                            dtype=x.dtype, shape=x.shape)
            for s in x.addressable_shards:
                if s.replica_id == 0:
                    out[s.index] = np.asarray(s.data)
            del out
        self.dtypes[name] = [x.dtype for x in leaves]

    def _load(self, name: str) -> list:
        where = os.path.join(self.directory, name)
        return [np.load(os.path.join(where, f"{i}.npy"), mmap_mode="r").view(d)
                for i, d in enumerate(self.dtypes[name])]


class Stash(_OnDisk):
    """One-device results ``(loss, grads)`` computed before the run at its first state (the
    finite-loss and separability checks'), for the first teacher-forced step: on disk until
    then, so nothing extra is held while the sharded step compiles and runs. Each is taken once;
    single-process runs only."""

    def __init__(self, trainable, count: int):
        from mlsys_jax.parallel.comm import nbytes

        super().__init__(count * nbytes(trainable), "mlsys-shard-stash-")
        self.kept: dict = {}       # name -> (loss, the grads' treedef)
        if jax.process_count() > 1:
            self.close()
            self.directory = None

    def put(self, name: str, result) -> None:
        if self.directory is None or name in self.kept:
            return
        loss, grads = result
        leaves, tree = jax.tree.flatten(grads)
        if any(jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended) for x in leaves):
            return
        self._save(name, leaves)
        self.kept[name] = (np.array(loss, copy=True), tree)

    def close(self) -> None:
        super().close()
        self.kept.clear()

    def take(self, name: str):
        """The result kept as ``name`` on this process's first device (None if none), then
        forgotten."""
        if name not in self.kept:
            return None
        loss, tree = self.kept.pop(name)
        device = jax.local_devices()[0]
        leaves = [jax.device_put(np.array(x), device) for x in self._load(name)]
        shutil.rmtree(os.path.join(self.directory, name), ignore_errors=True)
        return jax.device_put(loss, device), jax.tree.unflatten(tree, leaves)


class Trajectory(_OnDisk):
    """What the teacher-forced pass computed that the free-running pass would compute again:
    the one-device trajectory — each step's loss (a float) and gradients, and the final
    parameters — and the mesh's state after its first step, which is the free-running pass's
    first step too (the same program from the same state). On disk (:class:`_OnDisk`), so the
    run holds no more than before; where the disk cannot hold them, the free-running pass
    computes everything again."""

    def __init__(self, setup, steps: int):
        from mlsys_jax.parallel.comm import nbytes

        super().__init__((steps + 1) * nbytes(setup.trainable) + nbytes(setup.layout.opt_shapes),
                         "mlsys-shard-trajectory-")
        self.losses: list = []
        self.final = None
        self.start = None          # the treedef of the mesh's (params, opt_state), once kept

    def keep(self, step: int, loss, grads) -> None:
        """One step of the one-device trajectory."""
        if self.directory is not None:
            self._save(str(step), jax.tree.leaves(grads))
            self.losses.append(np.array(loss, copy=True))   # not a view: no device buffer held

    def grads(self, step: int) -> list:
        """Step ``step``'s gradient leaves, memory-mapped."""
        return self._load(str(step))

    def keep_start(self, params, opt_state) -> bool:
        """The mesh's state after its first step (one process's arrays only: across processes
        the free-running pass runs that step again). Whether it was kept."""
        leaves, tree = jax.tree.flatten((params, opt_state))
        if (self.directory is None or jax.process_count() > 1 or any(
                jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended) for x in leaves)):
            return False
        self._save("start", leaves)
        self.start = tree
        return True

    def start_state(self, shardings) -> tuple:
        """The kept state, laid out by ``shardings`` (``(params, opt_state)``'s)."""
        kept = self._load("start")
        placed = [jax.make_array_from_callback(x.shape, sh, lambda idx, x=x: np.asarray(x[idx]))
                  for x, sh in zip(kept, jax.tree.leaves(shardings))]
        return jax.tree.unflatten(self.start, placed)

    @property
    def complete(self) -> bool:
        return self.directory is not None and self.final is not None


def _progress(what: str, step: int, steps: int, t0: float) -> None:
    if steps >= 5 and (step + 1) % max(1, steps // 10) == 0:
        print(f"mlsys-jax shard: {what} step {step + 1}/{steps} ({time.perf_counter() - t0:.0f} "
              "s)", file=sys.stderr, flush=True)


def run(setup, sem, programs, mesh, steps: int, keep_params: bool = False,
        record: Recorder | None = None, stash: Stash | None = None) -> RunFigures:
    """``steps`` teacher-forced, then ``steps`` free-running steps of the compiled sharded step
    ``mesh`` (``programs``: the compiled one-device ``value_and_grad`` programs by loss name, the
    optimizer's ``advance`` and its ``init``). The two passes follow the one-device trajectory
    each: the mesh's own state is never held beside the copies a teacher-forced step takes.
    ``stash``: one-device results at the first state computed before the run (taken once)."""
    figures = RunFigures()
    record = record or Recorder(None)
    trajectory = Trajectory(setup, steps)
    try:
        _forced(setup, sem, programs, mesh, steps, figures, record=record, trajectory=trajectory,
                stash=stash)
        release_memory()
        mt = _free(setup, programs, mesh, steps, figures.free, record, trajectory)
    finally:
        trajectory.close()
    if keep_params:
        figures.final_params = jax.tree.map(host, mt)
    return figures


def _forced(setup, sem, programs, mesh, steps: int, figures: RunFigures, *, record,
            trajectory: Trajectory, stash: Stash | None) -> None:
    lay, eps, forced = setup.layout, setup.eps, figures.forced
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
        release_memory(generation=1)
        out = mesh(params_to_mesh(t), state_to_mesh(s), mesh_b)
        started = k == 0 and trajectory.keep_start(out[0], out[1])
        nt, lm, gm = _without_state(out)   # its new state is not judged: dropped here
        del out
        want = advance(on_one_device(gm), s, t)[0]
        forced["params"].add(leaf_diffs(nt, want), [0.0] * len(jax.tree.leaves(want)),
                             leaf_scales(want), eps)
        record("forced", k, "params", nt)
        del nt, want
        kept = stash if k == 0 else None
        lw, gw = _at_state(whole, "whole", kept, t, b)
        lr, gr = (lw, gw) if ref is whole else _at_state(ref, sem.reference, kept, t, b)
        lt, gt = _at_state(twin, sem.twin, kept, t, b)
        noise = (leaf_diffs(lr, lt), leaf_diffs(gr, gt))
        noise, narrow = low.measure((lm, gm), (lr, gr), (lt, gt), noise, t, b)
        del lt, gt
        forced["loss"].add(leaf_diffs(lm, lr), noise[0], leaf_scales(lr), eps, narrow[0])
        forced["grads"].add(leaf_diffs(gm, gr), noise[1], leaf_scales(gr), eps, narrow[1])
        record("forced", k, "loss", lm)
        record("forced", k, "grads", gm)
        if started:   # the free-running pass's first step is this one
            _free_figures(figures.free, record, 0, (lm, gm), (lw, gw))
        del gm, gr
        trajectory.keep(k, lw, gw)
        t, s = advance(gw, s, t)
        del gw
        _progress("teacher-forced", k, steps, t0)
    if trajectory.directory is not None:
        trajectory.final = t


def _at_state(program, name: str, stash: Stash | None, t, b):
    """``program(t, b)``, or its result at this state kept in ``stash`` as ``name``."""
    got = stash.take(name) if stash is not None else None
    return got if got is not None else program(t, b)


def _without_state(out):
    """A teacher-forced mesh step's parameters, loss and gradients, without its new optimizer
    state (a name bound to it would hold it through the next step's mesh call)."""
    nt, _, lm, gm = out
    return nt, lm, gm


def _free_figures(free: dict, record, k: int, mesh_out: tuple, one: tuple) -> None:
    """Step ``k`` of the free-running mesh (its loss and gradients) against one device's."""
    (lf, gf), (lw, gw) = mesh_out, one
    free["loss"] = max(free["loss"], *leaf_diffs(lf, lw))
    free["grads"] = max(free["grads"], *leaf_diffs(gf, gw), 0.0)
    record("free", k, "loss", lf)
    record("free", k, "grads", gf)


def _free(setup, programs, mesh, steps: int, free: dict, record, trajectory: Trajectory):
    """The mesh from its own state beside the one-device trajectory (read back from
    ``trajectory`` when it is complete, else recomputed), from the state after its first step
    where the teacher-forced pass kept it; returns its parameters."""
    lay = setup.layout
    t, b = setup.trainable, setup.batch
    mesh_b = place(b, lay.batch)
    first = 0
    if trajectory.start is not None:
        mt, ms = trajectory.start_state((lay.params, lay.opt_state))
        one, first = _Read(trajectory), 1
    else:
        s = programs["init"](t)
        mt, ms = copier(lay.params)(t), copier(lay.opt_state)(s)
        one = _Read(trajectory) if trajectory.complete else _Recomputed(programs, t, s, b)
        del s
    t0 = time.perf_counter()
    for k in range(first, steps):
        release_memory(generation=1)
        mt, ms, lf, gf = mesh(mt, ms, mesh_b)
        _free_figures(free, record, k, (lf, gf), one.get(k))
        del gf
        one.done()
        _progress("free-running", k, steps, t0)
    free["params"] = max(leaf_diffs(mt, one.final()), default=0.0)
    record("free", steps, "params", mt)
    return mt


class _Read:
    """The one-device trajectory as the teacher-forced pass kept it."""

    def __init__(self, trajectory: Trajectory):
        self.trajectory = trajectory

    def get(self, step: int) -> tuple:
        """``(loss, gradient leaves)`` at ``step``."""
        tr = self.trajectory
        return tr.losses[step], tr.grads(step)

    def done(self) -> None:
        pass

    def final(self):
        return self.trajectory.final


class _Recomputed:
    """The one-device trajectory computed again from the initial state (the disk could not hold
    it): each step's ``whole`` program, then the optimizer's update once the step is judged,
    before the next mesh step (the current state only is held)."""

    def __init__(self, programs, t, s, b):
        self.whole, self.advance = programs["whole"], programs["advance"]
        self.t, self.s, self.b, self.gw = t, s, b, None

    def get(self, step: int) -> tuple:
        lw, self.gw = self.whole(self.t, self.b)
        return lw, self.gw

    def done(self) -> None:
        self.t, self.s = self.advance(self.gw, self.s, self.t)
        self.gw = None

    def final(self):
        return self.t
