"""A user's own training step on a simulated mesh, against one device (§5, §7.3).

``simulate(loss_fn, params, batch, optimizer, {"data": 4}, ShardOptions(zero=1))`` checks and
lays out the step (``setup.py``), decides whether the loss is separable over the batch from its dataflow
and its gradients (``separability.py``), picks what the mesh computes and what it is judged
against (``semantics.py``), runs the steps teacher-forced and free-running (``run.py``), and
reports per-device bytes from XLA's ``memory_analysis`` beside ZeRO's formula, the collectives by
mesh axis beside formulas (``collectives.py``) and the step-time ratio (:class:`ShardReport`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from mlsys_jax import timing
from mlsys_jax.progress import SILENT, Progress
from mlsys_jax.parallel.shard import collectives, report, run, semantics, separability, step
from mlsys_jax.parallel.shard.batch.explain import Statistics
from mlsys_jax.parallel.shard import inputs
from mlsys_jax.parallel.shard.inputs import display_path, shard_shapes, trace_loss
from mlsys_jax.parallel.shard.layout import memory_report, per_device
from mlsys_jax.parallel.shard.options import ShardOptions
from mlsys_jax.parallel.shard.report import ShardReport
from mlsys_jax.parallel.shard.separability import shards_of
from mlsys_jax.parallel.shard.setup import prepare


class OneDevicePrograms(dict):
    """Compiled one-device ``value_and_grad`` programs by loss name, compiled when first asked
    for (a run needs three or four of the losses ``semantics.one_device_losses`` defines);
    ``shards_loop`` runs one compiled shard at a time and averages."""

    def __init__(self, losses: dict, trainable, batch, n: int, options):
        super().__init__()
        self.losses, self.args, self.n, self.options = losses, (trainable, batch), n, options
        self.pending: dict = {}   # name -> the future of its compile on a compile thread

    def ahead(self, names) -> None:
        """Start compiling ``names`` on the compile threads, in that order (each lowered here:
        the user's loss is traced on this thread only)."""
        for name in names:
            if name not in self and name not in self.pending:
                try:
                    lowered = step.lower_value_and_grad(self.losses[name], *self.args)
                except Exception:  # noqa: BLE001 — raised again, in its place, when first asked
                    continue
                self.pending[name] = step.in_background(lowered, self.options)

    def __missing__(self, name: str):
        if name in self.pending:
            self[name] = self.pending.pop(name).result()
        elif name == "shards_loop":
            self[name] = step.shard_by_shard(self.losses["_per"].shard_loss, *self.args, self.n,
                                             self.options)
        else:
            self[name] = step.value_and_grad(self.losses[name], *self.args, self.options)
        return self[name]


def one_device(setup, options, progress=None, check: bool = True,
               everywhere: bool = True, stash: bool = False) -> dict:
    """The one-device programs and the separability verdict (unless not ``check``), the same for
    every mesh of one data size: ``{"programs", "separability", "losses", "folded",
    "positional", "stash"}``. ``everywhere``: the numbers at every point of the check; else only
    where the dataflow leaves the verdict open (:func:`_separability`). ``stash``: keep the
    whole batch's and the shards' results at the given parameters on disk for the run's first
    step (``run.Stash``; else ``"stash"`` is None)."""
    losses, folded = semantics.one_device_losses(setup)
    t, b, n = setup.trainable, setup.batch, setup.data_size
    programs = OneDevicePrograms(losses, t, b, n, options)
    # compiled two at a time while this thread traces the next (the shards: the separability
    # check's and the run's twin); the optimizer's update after them
    programs.ahead(["whole", "shards"] if n > 1 and check else ["whole"])
    advance = step.in_background(step.lower_update(setup.optimizer, t, setup.layout.opt_shapes),
                                 options)
    programs["init"] = jax.jit(setup.optimizer.init)
    # the whole batch's loss, from the program the run compiles anyway, before anything compares
    # it; its gradients there are the separability check's first point
    first = programs["whole"](t, b)
    inputs.check_finite_loss(setup.loss, t, b, value=first[0])
    programs["advance"] = advance.result()
    kept = run.Stash(t, 2) if stash else None
    if kept is not None:
        kept.put("whole", first)
    walk = setup.walk
    positional = any(m.kind == "position" for m in walk.mixing)
    sep = None
    if n > 1 and check:
        sep = _separability(setup, programs, walk, folded, first, progress or SILENT, everywhere,
                            kept)
    del first
    return {"programs": programs, "separability": sep, "losses": losses, "folded": folded,
            "positional": positional, "stash": kept}


def _separability(setup, programs, walk, folded: int, first, progress, everywhere: bool,
                  stash=None):
    """The verdict, numbers at as few points as the dataflow allows. Where the walk followed the
    batch axis through every equation, the structure settles whether the loss is separable — an
    equation that mixes examples is named (a BatchNorm statistic used per example), or none is —
    and one point confirms it: the whole batch against the shards at the given parameters (a
    loss that sums instead of averaging, or mixing the walk missed, shows there). Every point is
    checked where the walk could not follow an equation, or where it names one but the first
    point agrees (whether the loss is equal on this batch takes them all). The shards' result
    at the first point goes to ``stash`` for the run's first step."""
    t, b, n = setup.trainable, setup.batch, setup.data_size
    args = (setup.closed, setup.batch_invars)
    kw = dict(eps=setup.eps, folded=folded, walk=walk, explain=_Deferred(setup),
              synced_axes=(setup.axis_name,) if setup.axis_name else ())
    at_first = {"whole": _Kept(programs["whole"], t, b, first),
                "shards": _Stashed(programs["shards"], t, b, stash)}
    followed = not any(m.kind == "unfollowed" and not m.synced for m in walk.mixing)
    if followed and not everywhere:
        progress.stage("checking separability: the dataflow, confirmed by whole-batch and "
                       "per-shard gradients at the given parameters")
        sep = separability.check_separable(*args, at_first, t, b, n, points=1, **kw)
        if sep.separable or not sep.equal_here:
            return sep
    progress.stage("checking separability: whole-batch and per-shard gradients at 4 points")
    return separability.check_separable(*args, at_first, t, b, n, **kw)


class _Kept:
    """A compiled program whose result at one ``(trainable, batch)`` pair was computed already:
    handed out once for that very pair (then dropped), computed for any other."""

    def __init__(self, program, t, b, result):
        self.program, self.args, self.result = program, (t, b), result

    def __call__(self, t, b):
        if self.result is not None and t is self.args[0] and b is self.args[1]:
            out, self.result = self.result, None
            return out
        return self.program(t, b)


class _Stashed:
    """A compiled program whose result at one ``(trainable, batch)`` pair also goes to a
    ``run.Stash`` (as ``"shards"``)."""

    def __init__(self, program, t, b, stash):
        self.program, self.args, self.stash = program, (t, b), stash

    def __call__(self, t, b):
        out = self.program(t, b)
        if self.stash is not None and t is self.args[0] and b is self.args[1]:
            self.stash.put("shards", out)
        return out


class _Deferred:
    """The loss's batch-wide sums evaluated per shard (``batch.explain.Statistics``), built when
    a verdict's sentences first ask for them (a trace of the loss at one shard's shapes): most
    verdicts never do."""

    def __init__(self, setup):
        self._setup, self._built = setup, None

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._built is None:
            self._built = _statistics(self._setup)
        return getattr(self._built, name)


def _statistics(setup) -> Statistics:
    """Batch-wide sums of the loss evaluated on the whole batch and shard by shard."""
    t, b, n = setup.trainable, setup.batch, setup.data_size
    env = [(setup.axis_name, 1)] if setup.axis_name else ()
    shard_closed = trace_loss(setup.loss, t, shard_shapes(b, n), env)
    leaves = jax.tree_util.tree_flatten_with_path(b)[0]
    n_params = len(jax.tree.leaves(t))
    names = {v: f"batch{jax.tree_util.keystr(p)}"
             for v, (p, _) in zip(setup.closed.jaxpr.invars[n_params:], leaves)}
    flat = [x for _, x in leaves]
    split = jax.jit(lambda xs: [list(x) for x in zip(*(shards_of(x, n) for x in xs))])(flat)
    shards = [[None] * n_params + list(s) for s in split]
    return Statistics(setup.closed, shard_closed, names, [None] * n_params + flat, shards)


def separability_of(loss_fn: Callable, params, batch, data: int, options: dict | None = None,
                    axis_names: dict | None = None):
    """The separability verdict of a loss over ``data`` shards (``separability.Separability``),
    without running a mesh."""
    import optax

    setup = prepare(loss_fn, params, batch, optax.sgd(0.0), {"data": data}, 0,
                    axis_names=axis_names)
    return one_device(setup, options)["separability"]


def simulate(loss_fn: Callable, params, batch, optimizer, mesh_shape: dict,
             options: ShardOptions | None = None, *, rules=None,
             cache: dict | None = None) -> ShardReport:
    """Run the user's step sharded and on one device; every figure of ``mlsys-jax shard``.

    ``options`` (:class:`ShardOptions`, its defaults when None) holds the run's settings: the ZeRO stage, the steps,
    axis rules and names, XLA compile options for every program (default: the compiler's normal
    settings), ``time_repeats=0`` to skip the timing, ``keep_params`` to keep the mesh's final
    parameters (``report.sharded``), ``record`` (a directory for each step's mesh values, for
    multi-process comparisons, or a :class:`run.Recorder` called with them), ``separable`` (a
    verdict already reached elsewhere, which skips the check) and ``judge=False`` (only run and
    record the steps, for a run judged elsewhere: no equivalent computation, bytes or
    collectives). ``rules`` are the factory's partition rules; ``cache``, a dict shared by calls
    on the same ``(loss_fn, params, batch, optimizer)``, keeps the one-device programs and the
    separability verdict per data size.
    """
    o = options or ShardOptions()
    with Progress("mlsys-jax shard", enabled=o.progress) as progress, \
            step.collections_of_this_run():
        return _simulate(loss_fn, params, batch, optimizer, mesh_shape, o=o, rules=rules,
                         cache=cache, progress=progress)


def _simulate(loss_fn, params, batch, optimizer, mesh_shape, *, o, rules, cache, progress):
    zero, steps, separable, judge, xla_options = o.zero, o.steps, o.separable, o.judge, \
        o.xla_options
    setup = prepare(loss_fn, params, batch, optimizer, mesh_shape, zero, rules=rules,
                    axis_rules=o.axis_rules, axis_names=o.axis_names)
    progress.stage("traced the loss and laid out the state")
    cache = {} if cache is None else cache
    key = ("one device", setup.data_size, str(xla_options), separable)
    ahead = _mesh_ahead(setup, o)
    if key not in cache:
        cache[key] = one_device(setup, xla_options, progress, check=separable is None,
                                everywhere=False, stash=True)
    ref = cache[key]
    try:
        sep, sem, mesh_step, measured, figures = _run(setup, ref, o, progress, ahead)
    finally:
        if ref["stash"] is not None:   # taken by the run's first step, or never
            ref["stash"].close()
    programs = ref["programs"]
    forced = figures.forced
    progress.stage("reading the compiled step's bytes and collectives")
    exact, here, reason = report.verdict(setup, sep, sem, forced)
    lay = setup.layout
    split = setup.split
    out = ShardReport(
        mesh=dict(lay.mesh.shape), zero=lay.stage, steps=steps, exact=exact, reason=reason,
        max_abs_diff=dict(figures.free), teacher_forced={q: j.diff for q, j in forced.items()},
        bound={q: j.bound for q, j in forced.items()},
        bound_ratio={q: j.ratio for q, j in forced.items()},
        magnitude={q: j.scale for q, j in forced.items()},
        noise={q: j.noise for q, j in forced.items()},
        per_device_bytes=measured, collectives=[],
        per_device=per_device(lay, mesh_step),
        step_time_ratio=None, semantics=sem.kind, equal_on_this_batch=here,
        separability=sep.summary() if sep is not None else {},
        axis_name=setup.axis_name,
        tensor_parallel=report.tensor_parallel(split, int(lay.mesh.shape.get("model", 1))),
        rules=[list(r) for r in split.rules], rules_derived=split.source == "derived",
        replicated_no_rule=[display_path(p) for p in split.replicated]
        if split.source in ("rules", "derived") and "model" in lay.mesh.axis_names else [],
        zero_unsplit=[display_path(p) for p in lay.unsplit] if lay.stage else [],
        sharded={"free": {"params": figures.final_params}} if o.keep_params else None)
    out.notes += report.thin_evidence(forced) + list(sep.notes if sep is not None else ())
    if not judge:
        return out
    _collectives(out, setup, sem, mesh_step, xla_options)
    if o.time_repeats:
        progress.stage("timing the steps")
        _time(out, setup, programs, mesh_step, o.time_repeats)
    return out


def _mesh_ahead(setup, o: ShardOptions):
    """The sharded step that runs the user's loss as one global program (what a separable loss,
    the usual verdict, or a single data shard runs: ``semantics.choose``) compiling on a compile
    thread while the one-device programs run: ``step.compile_ahead``'s ``step.Ahead``, or
    None where the semantics cannot be that (a model axis name bound to the data axis; a verdict
    of not separable given, or certain from the dataflow: an equation mixes examples)."""
    if setup.axis_name is not None or setup.data_size > 1 and (
            o.separable is False or setup.walk.shown_mixing):
        return None
    try:
        return step.compile_ahead(setup, setup.loss, o.xla_options, donate=True)
    except Exception:  # noqa: BLE001 — the semantics may be another; if not, raised again there
        return None


def _run(setup, ref: dict, o: ShardOptions, progress, ahead=None) -> tuple:
    """What the mesh computes, its step compiled and run: ``(separability, semantics, compiled
    step, its bytes, run.RunFigures)``. ``ahead``: :func:`_mesh_ahead`'s, taken where the
    semantics is that step's (else left to finish unused)."""
    sep, record = ref["separability"], o.record
    sem = semantics.choose(setup, o.separable if sep is None else sep.separable, ref["losses"],
                           ref["folded"], ref["positional"])
    if not o.judge:
        sem = dataclasses.replace(sem, reference="whole", twin="whole")
    step.release_memory()
    progress.stage("compiling the sharded step")
    traced: list = []
    mesh_step = step.compile_sharded(setup, sem.mesh, o.xla_options, donate=True, traced=traced,
                                     ahead=ahead if sem.mesh is setup.loss else None)
    _check_memory(setup, mesh_step)
    # the step's bytes from the trace its compile made (read now: the trace is not held through
    # the run)
    measured = memory_report(setup.layout, mesh_step, traced.pop())
    progress.stage(f"running {o.steps} steps, sharded and on one device")
    figures = run.run(setup, sem, ref["programs"], mesh_step, o.steps, o.keep_params,
                      record if isinstance(record, run.Recorder) else run.Recorder(record),
                      ref["stash"])
    return sep, sem, mesh_step, measured, figures


def _check_memory(setup, mesh_step) -> None:
    """Refuse, before any step runs, a run whose steps cannot fit: every simulated device's
    arguments, outputs and temporaries of the sharded step, beside one device's gradients and
    update (the training state again)."""
    from mlsys_jax import runtime
    from mlsys_jax.parallel.comm import nbytes

    ma, lay = mesh_step.memory_analysis(), setup.layout
    devices = lay.mesh.devices.size
    mesh = devices * (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes)
    state = 2 * nbytes(setup.trainable) + nbytes(lay.opt_shapes)
    runtime.check_memory(int(mesh + state), f"the sharded step on {devices} simulated devices "
                         "beside one device's", "use fewer devices, a smaller batch or model, or a "
                         "higher --zero stage")


def _collectives(out: ShardReport, setup, sem, compiled, options) -> None:
    lay = setup.layout
    synced = None
    if sem.kind == "synchronised":
        n = setup.data_size
        synced = (trace_loss(setup.loss, setup.trainable, shard_shapes(setup.batch, n),
                             [(setup.axis_name, n)]), setup.axis_name)
    formulas = collectives.formulas(sem.whole, setup.trainable, setup.batch, lay, synced)
    out.collectives = collectives.table(lay, compiled.as_text(), formulas)
    if "forward_all_reduces" in formulas:
        megatron = (setup.split.megatron if setup.split.source == "derived"
                    else formulas["forward_all_reduces"])
        out.forward_all_reduces, out.forward_all_reduce_sources = \
            collectives.forward_all_reduces(sem.mesh, setup.trainable, setup.batch, lay, megatron,
                                            options)
    if formulas["unused"]:
        names = ", ".join(display_path(p) for p in formulas["unused"])
        out.notes.append(f"{len(formulas['unused'])} parameters do not affect the loss (their "
                         f"gradient is zero; nothing is sent for them): {names}")


def _time(out: ShardReport, setup, programs, mesh_step, repeats: int) -> None:
    """Sharded step against one device's (gradient, then update), side by side; the sharded
    step donates its state, so it runs as a training loop does, each step on the last one's."""
    step.release_memory()   # the runs' freed host memory back first: the steps' own lands on it
    lay, t, b = setup.layout, setup.trainable, setup.batch
    s = programs["init"](t)
    state = [step.copier(lay.params)(t), step.copier(lay.opt_state)(s)]
    placed_b = step.place(b, lay.batch)

    def sharded():
        state[0], state[1], *rest = mesh_step(state[0], state[1], placed_b)
        return rest

    whole, advance = programs["whole"], programs["advance"]
    times = timing.compare({"sharded": sharded,
                            "one device": lambda: advance(whole(t, b)[1], s, t)},
                           repeats=repeats, warmup=1, min_time_s=2e-3)
    out.step_time_ratio = timing.ratio(times["sharded"], times["one device"]).median
    out.notes.append(f"step time: {times['sharded'].summary()} sharded vs "
                     f"{times['one device'].summary()} on one device (gradient, then update); "
                     "simulated devices share this machine's cores, so the ratio is overhead, "
                     "not speedup")
