"""`remat` at GPT-2 small's size beside one compile of its step: whole processes, side by side.

A user who compiles their step once starts Python, builds the model and calls
``jax.jit(jax.grad(loss)).lower(...).compile()``; that process (``COMPILE``) is the yardstick of
the ``..._over_one_compile_ratio`` figures (whole process over whole process). The
``..._after_loading_over_lower_compile_ratio`` figures set remat's own work (its process less the
seconds until the model was built) against lower + compile alone.
``remat_{no_,}policies_over_plain_ratio`` set each remat process against a plain process run
just before it (``COMPILE`` with its step: build the model, compile ``jax.grad`` of the same loss, run one step;
back to back, so the shared machine's load weighs on both alike).
``mlsys-jax remat examples/flax_gpt2.py:loss --budget 50%`` is run as a user runs it, in its own
process, with and without JAX's built-in policies. Wall time and peak RSS come from the process
itself (``os.wait4``: the child's own rusage); the compile process runs before and after the remat
runs and the figure is over their mean, so load that comes and goes weighs on both. The plan's
gradients are compared with ``jax.grad``'s in the remat process (max |Δ|); the first plain
process computes ``jax.grad``'s largest |g| so the difference can be stated relative to it.

The quick tier (GPT-2's tiny configuration) runs two processes instead of six: one plain process,
which is the one-compile yardstick too (it also runs the step, milliseconds at that size against
seconds of process), and ``remat --no-policies``; the figures with JAX's policies are the full
tier's.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILE = """
import json, sys, time
t0 = time.perf_counter()
import jax
sys.path.insert(0, "examples")
import flax_gpt2
loss_fn, params, batch = flax_gpt2.{factory}()
t1 = time.perf_counter()
exe = jax.jit(jax.grad(loss_fn)).lower(params, batch).compile()
t2 = time.perf_counter()
out = {{"setup_s": t1 - t0, "compile_s": t2 - t1,
       "temp_bytes": exe.memory_analysis().temp_size_in_bytes}}
if "{grads}" == "yes":
    grads = jax.tree_util.tree_leaves(exe(params, batch))
    out["max_abs_grad"] = max(float(abs(g).max()) for g in grads)
print(json.dumps(out))
"""


def _process(argv: list[str]) -> dict:
    """Run ``argv`` from the repository root; its wall seconds, peak RSS and stdout/stderr (to
    files, so that ``os.wait4`` reaps the child and returns its own rusage)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise RuntimeError(f"{' '.join(argv[:5])} … failed ({proc.returncode}): {stderr[-400:]}")
    return {"wall_s": wall, "rss_bytes": usage.ru_maxrss * 1024, "stdout": stdout,
            "stderr": stderr}


def _compile_once(factory: str, grads: bool = False) -> dict:
    run = _process([sys.executable, "-c", COMPILE.format(factory=factory,
                                                          grads="yes" if grads else "no")])
    return dict(run, **json.loads(run["stdout"].strip().splitlines()[-1]))


def _remat(factory: str, budget: str, policies: bool) -> dict:
    argv = [sys.executable, "-m", "mlsys_jax.cli", "remat", f"examples/flax_gpt2.py:{factory}",
            "--budget", budget, "--json"] + ([] if policies else ["--no-policies"])
    run = _process(argv)
    return dict(run, **json.loads(run["stdout"]))


def _loaded_at_s(stderr: str) -> float:
    """Seconds into ``remat`` when the factory had built the model: its first stage after
    loading (progress lines, ``mlsys-jax remat: [  5.8 s] tracing ...``)."""
    stages = [ln for ln in stderr.splitlines() if ln.startswith("mlsys-jax remat: [")]
    return float(stages[1].split("[", 1)[1].split(" s]", 1)[0])


def gpt2_figures(quick: bool) -> tuple[dict, list[str]]:
    # the tiny model's least-memory plan compiles to more than half of no remat's temp bytes
    factory, size, budget = ("loss_tiny", "gpt2_tiny", "70%") if quick else (
        "loss", "gpt2_small", "50%")
    compiles = [] if quick else [_compile_once(factory)]   # quick: the plain process is
    plain = [_compile_once(factory, grads=True)]       # back to back with each remat process
    plan = _remat(factory, budget, policies=False)
    runs = {"": plan}
    if not quick:
        plain.append(_compile_once(factory, grads=True))
        runs["with_policies_"] = _remat(factory, budget, policies=True)
        compiles.append(_compile_once(factory))
    before, after = compiles or plain * 2              # the one-compile yardstick
    wall = (before["wall_s"] + after["wall_s"]) / 2
    compile_s = (before["compile_s"] + after["compile_s"]) / 2
    rss = max(before["rss_bytes"], after["rss_bytes"])
    figures = {
        # whole process over whole process, each remat run right after its plain process (one
        # that builds the model, compiles jax.grad of the same loss and runs one step)
        "remat_no_policies_over_plain_ratio": plan["wall_s"] / plain[0]["wall_s"]}
    if not quick:
        figures["remat_policies_over_plain_ratio"] = \
            runs["with_policies_"]["wall_s"] / plain[1]["wall_s"]
    for tag, run in runs.items():
        figures.update({
            f"{size}_remat_{tag}over_one_compile_ratio": run["wall_s"] / wall,
            f"{size}_remat_{tag}rss_over_compile_rss_ratio": run["rss_bytes"] / rss,
            # remat's own work (the whole process less building the model; the interpreter's
            # start stays in) over lower + compile alone
            f"{size}_remat_{tag}after_loading_over_lower_compile_ratio":
                (run["wall_s"] - _loaded_at_s(run["stderr"])) / compile_s})
    figures.update({
        f"{size}_plan_over_no_remat_temp_ratio":
            plan["compiled_temp_bytes"] / before["temp_bytes"],
        f"{size}_plan_step_time_ratio": plan["step_time_ratio"],
        f"{size}_plan_grads_max_rel_diff": plan["grads_max_abs_diff"] / plain[0]["max_abs_grad"]})

    def both(key: str) -> str:  # the yardstick's figure: once in --quick, before and after
        return (f"{before[key]:.1f} s" if quick else
                f"{before[key]:.1f} s and {after[key]:.1f} s")
    what = ("one plain process (build, compile jax.grad, one step)" if quick else
            "one compile of jax.grad, whole process")
    note = (f"{size} (examples/flax_gpt2.py:{factory}): {what} {both('wall_s')} (building the "
            f"model {both('setup_s')}, lower + compile {both('compile_s')}), peak RSS "
            f"{rss / 1e9:.2f} GB; remat --budget {budget} --no-policies {plan['wall_s']:.1f} s, "
            f"{plan['rss_bytes'] / 1e9:.2f} GB")
    if quick:
        note += " (the figures with JAX's policies are the full tier's)"
    else:
        policies = runs["with_policies_"]
        note += (f"; with the policies {policies['wall_s']:.1f} s, "
                 f"{policies['rss_bytes'] / 1e9:.2f} GB; plain (build, compile, one step) "
                 f"{plain[0]['wall_s']:.1f} s before --no-policies, {plain[1]['wall_s']:.1f} s "
                 "before the policies")
    stages = [ln.split(": ", 1)[1] for ln in plan["stderr"].splitlines()
              if ln.startswith("mlsys-jax remat: [")]
    return figures, [note, f"{size} remat stages (elapsed): " + "; ".join(stages)]
