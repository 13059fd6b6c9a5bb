"""Peak memory of ``mlsys-jax shard`` on a GPT-2-small-shaped flax model, beside its training state.

The command runs as a child of a small launcher process, which reads the child's own peak RSS
(``os.wait4``): a child forked straight from the benchmark process would be charged the parent's
address space. The training state — parameters, AdamW's state and one set of gradients, on one
device — comes from the model's and the optimizer's shapes (``jax.eval_shape``, nothing
allocated here).

Beside the peak, in the same measurement, its parts that are no state of the run: the factory
alone (a second child under the same launcher: resident once Python, JAX, the command's modules,
the model and its parameters are loaded, and its own peak, the factory's initialisation) and the
sharded step's working memory — XLA's temporary bytes of one device (``memory_analysis``, from
the command's own report) times the simulated devices, which share this host's memory and all
run the step at once.
"""
from __future__ import annotations

import json
import math
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


# what the shard command has loaded before its first trace — Python, JAX, the command's modules,
# the factory's model and parameters (computed: the factory's jit runs asynchronously) — then
# this process's resident bytes once freed memory is handed back, as the command does between its
# phases (argv: devices, target)
_FACTORY_ONLY = ("import os, sys\n"
                 "from mlsys_jax import runtime\n"
                 "runtime.check_environment()\n"
                 "runtime.import_jax()\n"
                 "runtime.configure(devices=int(sys.argv[1]), x64=False)\n"
                 "runtime.start_backend()\n"
                 "import jax\n"
                 "from mlsys_jax.cli.commands import shard\n"
                 "from mlsys_jax.parallel.shard import simulate\n"
                 "with jax.enable_x64(False):\n"
                 "    loaded = shard.load_factory(sys.argv[2])\n"
                 "    jax.block_until_ready(loaded[1])\n"
                 "from mlsys_jax.parallel.shard.step import release_memory\n"
                 "release_memory()\n"
                 "pages = int(open('/proc/self/statm').read().split()[1])\n"
                 "print(pages * os.sysconf('SC_PAGE_SIZE'))\n")
DEVICES = 8


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


def _peak_rss(argv: list, env: dict) -> tuple[int, str]:
    """Run ``argv`` under the launcher: (its peak RSS in bytes, its stdout); a failure raises."""
    done = subprocess.run([sys.executable, "-c", _LAUNCHER, *argv], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, text=True)   # its progress on our stderr
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:4])} on GPT-2 small exited {done.returncode} (its "
                           "stderr above)")
    *out, rss = done.stdout.strip().splitlines()
    return int(rss), "\n".join(out)


def gpt2_small_shard_rss() -> dict:
    """``{"peak_rss", "factory_rss", "factory_peak", "step_temp", "state", "params", "seconds",
    "exact", "tokens", "devices"}`` of the shard command on GPT-2 small (``factory_rss``: the
    factory alone, resident once its parameters are computed; ``step_temp``: the sharded step's
    working memory on all simulated devices); a failed run raises."""
    state = training_state_bytes()
    argv = [sys.executable, "-m", "mlsys_jax.cli", "--devices", str(DEVICES), "shard", TARGET,
            "--mesh", MESH, "--zero", str(ZERO), "--steps", str(STEPS), "--json"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    factory_peak, factory_rss = _peak_rss([sys.executable, "-c", _FACTORY_ONLY, str(DEVICES),
                                           TARGET], env)
    print(f"[bench parallel] {' '.join(argv[3:])} (GPT-2 small, minutes) ...", file=sys.stderr,
          flush=True)
    t0 = time.perf_counter()
    peak_rss, report = _peak_rss(argv, env)
    seconds = time.perf_counter() - t0
    out = json.loads(report)
    devices = math.prod(out["mesh"].values())
    return {"peak_rss": peak_rss, "factory_rss": int(factory_rss), "factory_peak": factory_peak,
            "seconds": seconds,
            "step_temp": devices * out["per_device_bytes"]["measured"]["temp"],
            "devices": devices, "exact": out["exact"],
            "state": state["params"] + state["opt_state"] + state["grads"],
            "params": state["count"], "tokens": f"{state['batch']} x {state['seq']}"}
