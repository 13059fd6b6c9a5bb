"""A user's own training step on a simulated mesh, against one device (§5, §7.3).

``simulate(loss_fn, params, batch, optimizer, {"data": 4}, zero=1, steps=3)`` runs S optax steps
under ``jax.jit`` with ``NamedSharding`` (``user_plan.py`` decides the layout and semantics) and
the same S steps on one device. It reports max |Δ| of the loss, gradients and parameters after S
free-running steps, per-device bytes from XLA's ``memory_analysis`` beside the layout and ZeRO's
formula, the collectives by mesh axis beside formulas (``user_comm.py``), and the step-time ratio.

**Exact** is decided step by step, from the same state (teacher forcing): at each step the
sharded step starts from one device's parameters and optimizer state, and (1) its loss and
gradients must equal one device's within float rounding (they differ only in the order of the
batch sums), and (2) its new parameters must equal what the one-device optimizer makes of *those*
gradients within float rounding (so optax ran on global arrays: a per-shard global-norm clip
would be caught here). Free-running trajectories may drift apart by more than rounding: Adam
divides each gradient by its own magnitude, so a gradient that is mathematically zero (an
attention key bias: softmax ignores a shift of every score) turns rounding noise into a step of
up to the learning rate. ``max_abs_diff`` shows that drift; ``teacher_forced`` decides.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Callable

import jax
import numpy as np
import optax

from mlsys_jax import timing
from mlsys_jax.parallel.shard import collectives as user_comm
from mlsys_jax.parallel.shard.layout import memory_report
from mlsys_jax.parallel.shard.setup import ShardSetup, prepare

QUANTITIES = ("loss", "grads", "params")


@dataclass
class ShardReport:
    """Every figure of ``mlsys-jax shard``: the JSON object is :meth:`to_json`."""

    mesh: dict
    zero: int
    steps: int
    exact: bool
    reason: str
    max_abs_diff: dict        # free-running, after `steps` steps, against one device
    teacher_forced: dict      # per step from one device's state: what decides `exact`
    bound: dict               # float-rounding bound for teacher_forced
    magnitude: dict           # max |q| of the one-device reference (the bound's scale)
    per_device_bytes: dict
    collectives: list
    step_time_ratio: float | None
    forward_all_reduces: dict = field(default_factory=dict)
    rules: list = field(default_factory=list)
    rules_derived: bool = False
    replicated_no_rule: list = field(default_factory=list)
    zero_unsplit: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    sharded: dict | None = field(default=None, repr=False)  # host values: free, forced

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("sharded")
        return out


def make_step(loss: Callable, optimizer: optax.GradientTransformation, layout=None) -> Callable:
    """``step(trainable, opt_state, batch) -> (trainable, opt_state, loss, grads)``.

    With a layout the parameters are constrained to their TP sharding for the forward pass (so
    ZeRO-3 gathers them once, §7.3) and the gradients to the stage's sharding.
    """
    def step(t, s, b):
        used = t if layout is None else jax.lax.with_sharding_constraint(t, layout.compute)
        value, grads = jax.value_and_grad(loss)(used, b)
        if layout is not None:  # reduce over data first (every stage), then keep the stage's part
            grads = jax.lax.with_sharding_constraint(grads, layout.compute)
            grads = jax.lax.with_sharding_constraint(grads, layout.grads)
        updates, s = optimizer.update(grads, s, t)
        return optax.apply_updates(t, updates), s, value, grads
    return step


def compile_sharded(p: ShardSetup, options: dict | None = None):
    """The sharded step compiled for the plan's layout."""
    lay = p.layout
    fn = jax.jit(make_step(p.step_loss, p.optimizer, lay),
                 in_shardings=(lay.params, lay.opt_state, lay.batch),
                 out_shardings=(lay.params, lay.opt_state, lay.replicated, lay.grads))
    return fn.lower(p.trainable, lay.opt_shapes, p.batch).compile(options)


def place(tree, shardings):
    """Put host or single-device arrays on the mesh (each process supplies its own shards)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(
        x.shape, s, lambda idx, x=np.asarray(x): x[idx]), tree, shardings)


def to_host(tree):
    """NumPy copies of arrays, gathering those spread over several processes."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)
    return jax.tree.map(one, tree)


def run_steps(compiled, t, s, b, steps: int) -> dict:
    """Run ``steps`` steps: host losses and gradients per step, final params, and each step's
    starting state (``states``, device arrays) for teacher forcing."""
    losses, grads, states = [], [], []
    for _ in range(steps):
        states.append((t, s))
        t, s, value, g = compiled(t, s, b)
        losses.append(value)
        grads.append(g)
    return {"loss": to_host(losses), "grads": to_host(grads), "params": to_host(t),
            "states": states}


def run_sharded(p: ShardSetup, steps: int, options: dict | None = None):
    """``(values, compiled, placed inputs)`` of ``steps`` free-running sharded steps."""
    compiled = compile_sharded(p, options=options)
    lay = p.layout
    state = jax.jit(p.optimizer.init)(p.trainable)  # one compile, not one per eager zeros_like
    args = (place(p.trainable, lay.params), place(state, lay.opt_state), place(p.batch, lay.batch))
    return run_steps(compiled, *args, steps), compiled, args


def max_diffs(a: dict, b: dict) -> dict:
    """``{quantity: (max |a - b|, max |b|)}`` over steps and leaves."""
    out = {}
    for q in QUANTITIES:
        pairs = list(zip(jax.tree.leaves(a[q]), jax.tree.leaves(b[q])))
        out[q] = (max(float(np.max(np.abs(np.asarray(u, np.float64) - v), initial=0.0))
                      for u, v in pairs),
                  max(float(np.max(np.abs(np.asarray(v, np.float64)), initial=0.0))
                      for _, v in pairs))
    return out


def one_device(p: ShardSetup, loss: Callable, steps: int, options: dict | None) -> dict:
    """The reference: ``steps`` steps of ``loss`` on one device, and its optimizer alone."""
    one = jax.jit(make_step(loss, p.optimizer)).lower(
        p.trainable, p.layout.opt_shapes, p.batch).compile(options)
    args = (p.trainable, jax.jit(p.optimizer.init)(p.trainable), p.batch)

    def apply(g, s, t):
        return optax.apply_updates(t, p.optimizer.update(g, s, t)[0])
    update = jax.jit(apply).lower(p.trainable, p.layout.opt_shapes, p.trainable).compile(options)
    return {"values": run_steps(one, *args, steps), "compiled": one, "args": args,
            "update": update}


def teacher_forced(p: ShardSetup, compiled, ref: dict, placed_batch) -> tuple[dict, dict]:
    """Each step from the reference's state: the sharded loss and gradients against the
    reference's, and the sharded new parameters against the one-device optimizer applied to the
    sharded gradients. Returns ``{quantity: (max |Δ|, max |reference|)}`` and the sharded
    values (host arrays per step)."""
    lay, vals = p.layout, ref["values"]
    got = {"loss": [], "grads": [], "params": []}
    want = {"loss": vals["loss"], "grads": vals["grads"], "params": []}
    for t, s in vals["states"]:
        new, _, value, g = compiled(place(t, lay.params), place(s, lay.opt_state), placed_batch)
        g = to_host(g)
        got["loss"].append(to_host(value))
        got["grads"].append(g)
        got["params"].append(to_host(new))
        want["params"].append(to_host(ref["update"](g, s, t)))
    return max_diffs(got, want), got


def simulate(loss_fn: Callable, params, batch, optimizer, mesh_shape: dict, zero: int = 0,
             steps: int = 3, rules=None, options: dict | None = None, time_repeats: int = 5,
             cache: dict | None = None) -> ShardReport:
    """Run the user's step sharded and on one device; every figure of ``mlsys-jax shard``.

    ``options`` are XLA compile options for every program (e.g. ``comm.QUICK_COMPILE``);
    ``time_repeats=0`` skips the timing; ``cache``, a dict shared by calls on the same
    ``(loss_fn, params, batch, optimizer)``, keeps the one-device run for the next call.
    """
    cache = {} if cache is None else cache
    p = prepare(loss_fn, params, batch, optimizer, mesh_shape, zero, rules, cache)
    sharded, compiled, args = run_sharded(p, steps, options)
    key = ("one device", steps)
    if key not in cache:
        cache[key] = one_device(p, p.loss, steps, options)
    ref = cache[key]
    if not p.separability.separable:  # the same per-shard semantics, on one device
        ref = one_device(p, p.same_loss, steps, options)
    free = max_diffs(sharded, cache[key]["values"])
    forced, forced_values = teacher_forced(p, compiled, ref, args[2])
    bound = {q: p.rtol * scale for q, (_, scale) in forced.items()}
    within = all(forced[q][0] <= bound[q] for q in QUANTITIES)
    report = ShardReport(
        mesh=dict(p.layout.mesh.shape), zero=p.layout.stage, steps=steps, exact=False,
        reason="", max_abs_diff={q: d for q, (d, _) in free.items()},
        teacher_forced={q: d for q, (d, _) in forced.items()}, bound=bound,
        magnitude={q: m for q, (_, m) in forced.items()},
        per_device_bytes=memory_report(p.layout, compiled, jax.make_jaxpr(
            make_step(p.step_loss, p.optimizer, p.layout))(p.trainable, p.layout.opt_shapes,
                                                           p.batch)),
        collectives=[], step_time_ratio=None,
        rules=[[rx, str(spec)] for rx, spec in p.rules], rules_derived=p.rules_derived,
        replicated_no_rule=list(p.placement.unmatched) if p.rules else [],
        zero_unsplit=list(p.layout.unsplit) if p.layout.stage else [],
        sharded={"free": {q: sharded[q] for q in QUANTITIES}, "forced": forced_values})
    report.exact, report.reason = _verdict(p, forced, bound, within)
    formulas = user_comm.formulas(p.step_loss, p.trainable, p.batch, p.layout)
    report.collectives = user_comm.table(p.layout, compiled.as_text(), formulas)
    if "forward_all_reduces" in formulas:
        report.forward_all_reduces = user_comm.forward_all_reduces(
            p.step_loss, p.trainable, p.batch, p.layout, formulas["forward_all_reduces"], options)
    if formulas["unused"]:
        report.notes.append(f"{len(formulas['unused'])} parameters do not affect the loss (their "
                            f"gradient is zero; nothing is sent for them): "
                            f"{', '.join(formulas['unused'])}")
    if time_repeats:
        one, one_args = cache[key]["compiled"], cache[key]["args"]
        t = timing.compare({"sharded": lambda: compiled(*args),
                            "one device": lambda: one(*one_args)},
                           repeats=time_repeats, warmup=1, min_time_s=2e-3)
        report.step_time_ratio = timing.ratio(t["sharded"], t["one device"]).median
        report.notes.append(f"step time: {t['sharded'].summary()} sharded vs "
                            f"{t['one device'].summary()} on one device; simulated devices "
                            "share this machine's cores, so the ratio is overhead, not speedup")
    return report


def _verdict(p: ShardSetup, forced: dict, bound: dict, within: bool) -> tuple[bool, str]:
    worst = max(QUANTITIES, key=lambda q: forced[q][0] / max(bound[q], 1e-300))
    off = (f"max |Δ{worst}| {forced[worst][0]:.3g} > bound {bound[worst]:.3g} at the same "
           "state")
    sep = p.separability
    if not sep.separable:
        same = ("the mesh computes exactly that (teacher-forced, within float rounding)"
                if within else f"and the mesh does not even compute that: {off}")
        return False, (f"not separable over the batch (whole-batch loss {sep.whole:.6g}, mean "
                       f"of the shards' losses {sep.shards_mean:.6g}): "
                       + "; ".join(sep.causes) + f"; {same}")
    if not within:
        return False, f"the sharded step differs from one device by more than float rounding: {off}"
    return True, (f"separable loss; loss, gradients and optimizer update equal one device's "
                  f"within {p.rtol:.3g} x their largest magnitude (float rounding), step by step")
