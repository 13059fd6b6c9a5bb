"""Graph-break capture (lecture §8.4, exercise 8): captured vs eager vs lax.cond under jit.

Three functions, each timed side by side after warm-up (hundreds of short rounds, each running
every variant in a shuffled order; median and 10th–90th percentile of paired ratios): the one-break ``branchy`` (``h = relu(x @ w1); h * 2 if h.sum() > 0 else
exp(h)``) on each outcome, and ``two_breaks`` (a second layer and a second ``if``) — op-by-op
eager JAX, the same Python under ``mlsys_jax.capture`` (exact mode: results bitwise equal to
eager), and the function rewritten with ``lax.cond`` under ``jax.jit``. Warm-up calls the captured
function on every outcome, so warm calls run the whole guard tree as one program
(``mlsys_jax/execute/capture/one_program.py``): one dispatch, no guard read on the host.

Two modes: back-to-back calls (the harness waits only for the last result, so jitted calls
pipeline on JAX's async dispatch) and *waited* calls (each result waited for: the latency a
caller that uses the result sees). With PyTorch installed, ``two_breaks`` also runs under
``torch.compile`` (graph breaks at both ifs; skipped with a note when torch is absent).

Cold capture: the first call of a captured 2,000-op random elementwise chain (it runs the
Python and dispatches op by op, as eager) and its first compiled replay (the third call), against
``jax.jit``'s first call (trace and compile) of the same function, in this process's CPU time
(wall time beside it); and a fresh capture's first call of ``two_breaks`` over the eager call,
paired round by round: what recording, and watching the Python's reads and side effects
(``mlsys_jax/execute/capture/reads.py``), cost on a cold call.
"""
from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import timing
from mlsys_jax.execute import capture
from mlsys_jax.models import branchy, branchy_cond
from mlsys_jax.models.branchy import two_breaks, two_breaks_cond

NAME = "capture"


# Microsecond calls, so many short rounds: each round runs every variant in a fresh order
# (timing.compare's shuffle) — back to back: BATCH calls, only the last result waited for (eager,
# much slower, as many calls as fill min_time_s); waited: one call, its result waited for — and a
# figure is the median of the per-round ratios with their 10th–90th percentiles. Waited times
# are bimodal (XLA:CPU's worker thread still awake, or woken: docs/capture.md), so a few long
# rounds could not decide a 15% target. Every compiled variant gets the same BATCH: a
# round's fixed cost (waking the worker, the final wait) is then the same share of each.
BATCH = 64
SPREAD = (10, 90)


def _side_by_side(name, fns: dict, rounds: int, figures: dict, notes: list) -> dict:
    batch = {k: BATCH for k in fns if not k.endswith("eager")}
    t = timing.compare(fns, repeats=rounds, number=batch, min_time_s=1e-3, shuffle=True)
    waited = timing.compare(fns, repeats=4 * rounds, number=1, shuffle=True)
    t.update({f"{k}_waited": v for k, v in waited.items()})
    for mode in ("", "_waited"):
        e, c, j = t[f"eager{mode}"], t[f"captured{mode}"], t[f"cond_jit{mode}"]
        ec, cj = timing.ratio(e, c, SPREAD), timing.ratio(c, j, SPREAD)  # paired, round by round
        figures[f"{name}{mode}_eager_over_captured_ratio"] = ec.to_dict()
        figures[f"{name}{mode}_captured_over_cond_jit_ratio"] = cj.to_dict()
        notes.append(f"{name}{mode or ' back-to-back'}: eager {e.median_us:.1f} µs, captured "
                     f"{c.median_us:.1f} µs, lax.cond-jit {j.median_us:.1f} µs (medians of "
                     f"{c.repeats} shuffled rounds); eager/captured {ec.median:.1f}×, "
                     f"captured/cond-jit {cj.median:.2f}× [{cj.low:.2f}–{cj.high:.2f}] (median "
                     f"of per-round ratios [10th–90th percentile])")
    if "program" in fns:  # the program against lax.cond-jit, the Python path against the program
        _split(name, t, figures, notes)
    figures[f"{name}_us"] = {k: v.to_dict() for k, v in t.items()}
    return t


def _program(captured, args):
    """The warm call's own program, called directly (what its hot path calls): captured over this
    is the Python path (type check, input key, lookup) that a warm call adds."""
    for _ in range(3):  # a walk, then the one program, then the hot path is set
        captured(*args)
    direct = captured.roots[next(iter(captured.roots))].fast.direct(len(args))
    return lambda: direct(*args)


def _split(name, t, figures, notes):
    for mode in ("", "_waited"):
        parts = {f"{a}_over_{b}": timing.ratio(t[a + mode], t[b + mode], SPREAD)
                 for a, b in (("program", "cond_jit"), ("captured", "program"))}
        for k, r in parts.items():
            figures[f"{name}{mode}_{k}_ratio"] = r.to_dict()
        notes.append(f"{name}{mode or ' back-to-back'}: " + ", ".join(
            f"{k.replace('_over_', '/')} {r.median:.2f}× [{r.low:.2f}–{r.high:.2f}]"
            for k, r in parts.items()))
    python_us = [1e6 * (c - p) for c, p in zip(t["captured"].samples, t["program"].samples)]
    us = {f"p{p}_us": timing.percentile(python_us, p) for p in SPREAD}
    figures[f"{name}_warm_call_python_us"] = {
        "median_us": timing.percentile(python_us, 50), **us, "rounds": len(python_us)}
    notes.append(f"{name}: a warm call's Python path (type check, key, lookup) adds "
                 f"{timing.percentile(python_us, 50):.1f} µs [{us['p10_us']:.1f}–"
                 f"{us['p90_us']:.1f}] to its one program's call (back to back; median of "
                 f"per-round differences [10th–90th percentile])")


def _torch_two_breaks():
    """two_breaks in PyTorch under torch.compile, or None (with the reason) without torch."""
    try:
        import torch
    except ImportError as e:
        return None, f"torch.compile comparison skipped: PyTorch is not installed ({e})"
    # One intra-op thread, like XLA:CPU on these small matmuls: with two, torch's OpenMP workers
    # spin against the other processes of this shared 2-core machine.
    torch.set_num_threads(1)

    def fn(x, w1, w2):
        h = torch.relu(x @ w1)
        h = h * 2 if h.sum() > 0 else torch.exp(h)
        g = h @ w2
        return torch.tanh(g) if g.sum() > 0 else g * 0.5

    return (torch, fn, torch.compile(fn)), (f"torch {torch.__version__}, torch.compile(fn) on CPU, "
                                        "1 thread; torch's CPU calls return finished tensors")


def _two_breaks(rng, rounds, figures, notes):
    x = jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)
    w1, w2 = (jnp.asarray(rng.standard_normal((64, 64)), jnp.float32) for _ in range(2))
    paths = [(x, w1, w2), (x, w1, -w2), (jnp.abs(x), -jnp.abs(w1), w2),
             (jnp.abs(x), -jnp.abs(w1), -w2)]
    captured, cond_jit = capture(two_breaks), jax.jit(two_breaks_cond)
    for args in paths:  # every outcome of both breaks seen: the tree closes (no miss flag)
        captured(*args)
    args = paths[0]
    same = all(np.asarray(captured(*a)).tobytes() == np.asarray(two_breaks(*a)).tobytes()
               for a in paths)
    cond_same = all(np.array_equal(cond_jit(*a), two_breaks(*a)) for a in paths)
    fns = {"eager": lambda: two_breaks(*args), "captured": lambda: captured(*args),
           "cond_jit": lambda: cond_jit(*args)}
    fns["program"] = _program(captured, args)
    torch_fn, note = _torch_two_breaks()
    if torch_fn is not None:
        torch, eager_fn, compiled = torch_fn
        targs = [torch.tensor(np.asarray(a)) for a in args]
        out = compiled(*targs)
        fns["torch_compile"] = lambda: compiled(*targs)
        fns["torch_eager"] = lambda: eager_fn(*targs)
        note += (f"; result matches ours within 1e-4: "
                 f"{bool(np.allclose(out.numpy(), np.asarray(two_breaks(*args)), atol=1e-4))}")
    t = _side_by_side("two_breaks", fns, rounds, figures, notes)
    if torch_fn is not None:
        for mode in ("", "_waited"):
            r = timing.ratio(t[f"captured{mode}"], t[f"torch_compile{mode}"], SPREAD)  # paired
            figures[f"two_breaks{mode}_captured_over_torch_compile_ratio"] = r.to_dict()
            notes.append(f"two_breaks{mode or ' back-to-back'}: captured/torch.compile "
                         f"{r.median:.2f}× [{r.low:.2f}–{r.high:.2f}] (torch.compile "
                         f"{t[f'torch_compile{mode}'].median_us:.1f} µs, torch eager "
                         f"{t[f'torch_eager{mode}'].median_us:.1f} µs)")
    notes.append(note)
    notes.append(f"two_breaks, all four paths: captured results equal eager bitwise: {same}; "
                 f"lax.cond-jit's equal eager: {cond_same}; capture cache {captured.stats}")


def _chain(n: int):
    rng = np.random.default_rng(7)
    ops, consts = rng.integers(0, 6, n), rng.uniform(0.5, 1.5, n)

    def chain(x):
        for o, c in zip(ops, consts):
            x = _op(o, x, float(c))
        return x
    return chain


def _op(o, x, c):
    if o == 0:
        return jnp.sin(x)
    if o == 1:
        return x * c
    if o == 2:
        return x + c
    if o == 3:
        return jnp.tanh(x)
    if o == 4:
        return jnp.cos(x) - x
    return jnp.sqrt(jnp.abs(x))


def _timed(fn):
    """(result, wall seconds, CPU seconds of this process): compiling is CPU-bound, and on a
    shared machine the process's own CPU time is the steadier measure."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0, time.process_time() - c0


def _cold(n, figures, notes):
    chain, x = _chain(n), jnp.ones((64,), jnp.float32)
    jitted, jit_wall, jit_cpu = _timed(lambda: jax.jit(chain)(x))
    c = capture(chain)
    _, cold_wall, cold_cpu = _timed(lambda: c(x))
    c(x)
    got, replay_wall, replay_cpu = _timed(lambda: c(x))  # the first compiled replay
    figures[f"chain_{n}_cold_capture_over_jit_first_call_ratio"] = {
        "ratio": cold_cpu / jit_cpu, "wall_ratio": cold_wall / jit_wall}
    figures[f"chain_{n}_first_compiled_replay_over_jit_first_call_ratio"] = {
        "ratio": replay_cpu / jit_cpu, "wall_ratio": replay_wall / jit_wall}
    eager = chain(x)
    notes.append(f"{n}-op chain, CPU seconds (wall): jax.jit first call {jit_cpu:.2f} "
                 f"({jit_wall:.2f}); captured cold call {cold_cpu:.2f} ({cold_wall:.2f}): records, "
                 f"runs op by op, compiles nothing; first compiled replay {replay_cpu:.2f} "
                 f"({replay_wall:.2f}): {len(c.cache)} programs of ≤ 500 ops; captured result "
                 f"equals eager bitwise: {np.asarray(got).tobytes() == np.asarray(eager).tobytes()}"
                 f"; jax.jit's equals eager: {np.array_equal(jitted, eager)}")


def _cold_over_eager(rng, rounds, figures, notes):
    x = jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)
    w1, w2 = (jnp.asarray(rng.standard_normal((64, 64)), jnp.float32) for _ in range(2))
    t = timing.compare({"eager": lambda: two_breaks(x, w1, w2),
                        "cold_capture": lambda: capture(two_breaks)(x, w1, w2)},
                       repeats=rounds, number=1, shuffle=True, clock=time.process_time)
    r = timing.ratio(t["cold_capture"], t["eager"], SPREAD)
    figures["two_breaks_cold_capture_over_eager_ratio"] = r.to_dict()
    notes.append(f"two_breaks, a fresh capture's first call over the eager call (CPU time, "
                 f"{rounds} paired rounds): {r.median:.2f}× [{r.low:.2f}–{r.high:.2f}] (eager "
                 f"{t['eager'].median_us:.0f} µs, cold capture {t['cold_capture'].median_us:.0f} "
                 "µs): it runs the Python on deferred values, watches its reads and side effects "
                 "and runs each graph dispatch by dispatch")


def run(quick: bool = False) -> dict:
    rounds = 100 if quick else 800  # back to back; waited: 4× as many (one call each)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((32, 64)), jnp.float32)
    w1 = jnp.asarray(rng.standard_normal((64, 64)), jnp.float32)
    inputs = {"mul_branch": (x, w1), "exp_branch": (jnp.abs(x), -jnp.abs(w1))}
    captured, cond_jit = capture(branchy), jax.jit(branchy_cond)
    for args in inputs.values():  # warm-up: both outcomes of the branch seen (two cold calls)
        captured(*args)
    figures, notes = {}, []
    for branch, args in inputs.items():
        same = all(np.array_equal(f(*args), branchy(*args)) for f in (captured, cond_jit))
        fns = {"eager": lambda: branchy(*args), "captured": lambda: captured(*args),  # noqa: B023 (called in this iteration)
               "cond_jit": lambda: cond_jit(*args), "program": _program(captured, args)}  # noqa: B023 (called in this iteration)
        _side_by_side(branch, fns, rounds, figures, notes)
        notes.append(f"{branch}: captured and lax.cond-jit results equal eager bitwise: {same}")
    notes.append(f"branchy capture cache: {captured.stats}")
    _two_breaks(rng, rounds, figures, notes)
    _cold_over_eager(rng, 20 if quick else 100, figures, notes)
    _cold(500 if quick else 2000, figures, notes)
    notes.append("captured = mlsys_jax.capture(fn) in exact mode (results bitwise equal to eager)")
    notes.append(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return {"figures": figures, "notes": notes}


if __name__ == "__main__":
    from mlsys_jax import runtime

    runtime.configure()
    out = run(quick=True)
    for k, v in out["figures"].items():
        print(k, v)
    print("\n".join(out["notes"]))
