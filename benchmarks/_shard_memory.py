"""Peak memory of ``mlsys-jax shard`` on a GPT-2-small-shaped flax model, beside its training state.

The command runs as a child of a small launcher process, which reads the child's own peak RSS
(``os.wait4``): a child forked straight from the benchmark process would be charged the parent's
address space. The training state — parameters, AdamW's state and one set of gradients, on one
device — comes from the model's and the optimizer's shapes (``jax.eval_shape``, nothing
allocated here).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = "examples/flax_gpt2.py:train"
MESH, ZERO, STEPS = "data=4,model=2", 3, 2

# run argv[1:] as a child (its output passed on), then print its peak RSS in bytes on a line of
# its own; exit with its status
_LAUNCHER = ("import os, subprocess, sys\n"
             "child = subprocess.Popen(sys.argv[1:])\n"
             "_, status, usage = os.wait4(child.pid, 0)\n"
             "print(usage.ru_maxrss * 1024)\n"
             "sys.exit(os.waitstatus_to_exitcode(status))\n")


def training_state_bytes() -> dict:
    """Bytes of GPT-2 small's parameters, its AdamW state and its gradients on one device."""
    import jax

    from mlsys_jax.parallel.comm import nbytes

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import flax_gpt2
    finally:
        sys.path.pop(0)
    config = flax_gpt2.GPT2_SMALL
    with jax.enable_x64(False):
        batch = jax.eval_shape(lambda: flax_gpt2.batch_of(config))
        params = jax.eval_shape(flax_gpt2.GPT2(config).init, jax.random.key(0), batch["tokens"])
        opt_state = jax.eval_shape(flax_gpt2.optimizer().init, params)
    return {"params": nbytes(params), "opt_state": nbytes(opt_state), "grads": nbytes(params),
            "count": sum(x.size for x in jax.tree.leaves(params)), "batch": config.batch,
            "seq": config.seq}


def gpt2_small_shard_rss() -> dict:
    """``{"peak_rss", "state", "params", "seconds", "exact", "tokens"}`` of the shard command on GPT-2
    small; a failed run raises."""
    state = training_state_bytes()
    argv = [sys.executable, "-m", "mlsys_jax.cli", "--devices", "8", "shard", TARGET,
            "--mesh", MESH, "--zero", str(ZERO), "--steps", str(STEPS), "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    print(f"[bench parallel] {' '.join(argv[3:])} (GPT-2 small, minutes) ...", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, text=True)   # its progress on our stderr
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"shard on GPT-2 small exited {done.returncode} (its stderr above)")
    *report, rss = done.stdout.strip().splitlines()
    out = json.loads("\n".join(report))
    return {"peak_rss": int(rss), "seconds": seconds, "exact": out["exact"],
            "state": state["params"] + state["opt_state"] + state["grads"],
            "params": state["count"], "tokens": f"{state['batch']} x {state['seq']}"}
