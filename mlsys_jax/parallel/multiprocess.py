"""The data-parallel step as N local processes through ``jax.distributed`` (gloo CPU collectives).

§5.1 at the scale where it matters: the same shard_map program, now spanning processes. Each
worker owns ``devices_per_process`` simulated CPU devices, joins a coordinator on 127.0.0.1, builds
the mesh over *all* processes' devices, feeds only its own slice of the batch
(``jax.make_array_from_process_local_data``) and runs :func:`data.make_dp_step`. Every worker
prints its result as one JSON line; :func:`launch` starts the workers, collects the lines and
checks that all ranks agree. JAX is imported inside functions: a worker must set its device
count (``runtime.configure``) before JAX starts.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile

import numpy as np

from mlsys_jax.errors import MlsysError

MARKER = "MLSYS_JAX_RESULT "
SETTINGS = {"seed": 0, "batch": 32, "sizes": (16, 32, 4), "steps": 2, "lr": 0.05}
MODULE = "mlsys_jax.parallel.multiprocess"


def run_dp_demo(seed: int, batch: int, sizes, steps: int, lr: float, mesh=None) -> dict:
    """Run ``steps`` DP steps (Adam) over ``mesh`` (default: every device of every process).

    Returns plain lists (losses, updated params and last gradients, flattened).
    """
    import jax
    import optax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from mlsys_jax.models import mlp_loss
    from mlsys_jax.parallel.data import demo_problem, even_counts, flatten, make_dp_step, pad_shards
    from mlsys_jax.parallel.mesh import make_mesh

    params, x, y = demo_problem(seed, batch, sizes)
    mesh = make_mesh({"data": jax.device_count()}) if mesh is None else mesh
    n = mesh.devices.size
    xp, yp, mask = pad_shards(x, y, even_counts(batch, n))
    # each process hands over only the rows its own devices hold
    rows = len(xp) // jax.process_count()
    mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
    sharding = NamedSharding(mesh, P("data"))
    xs, ys, ms = (jax.make_array_from_process_local_data(sharding, np.asarray(a)[mine], a.shape)
                  for a in (xp, yp, mask))
    optimizer = optax.adam(lr)
    opt_state = optimizer.init(params)
    step = make_dp_step(mlp_loss, optimizer, mesh)
    losses = []
    for _ in range(steps):
        params, opt_state, loss, grads = step(params, opt_state, xs, ys, ms)
        losses.append(_local(loss).item())
    flat = lambda tree: flatten(jax.tree.map(_local, tree)).tolist()
    return {"losses": losses, "params": flat(params), "grads": flat(grads),
            "devices": n, "processes": jax.process_count()}


def _local(a):
    """A replicated global array's value, read from this process's first device."""
    return np.asarray(a.addressable_data(0))


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now (for the coordinator)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(processes: int, devices_per_process: int, settings: dict | None = None,
           timeout: float = 180.0, module: str = MODULE) -> dict:
    """Start ``processes`` workers on 127.0.0.1 and return process 0's result (raises on failure).

    ``module`` is run as ``python -m module`` with the arguments :func:`worker_args` parses
    (default: this module's DP demo); each worker prints its result with :func:`report`.
    """
    if processes < 2:
        raise MlsysError(f"--processes must be >= 2 for a multi-process run, got {processes}")
    if devices_per_process < 1:
        raise MlsysError(f"each process needs >= 1 device, got {devices_per_process}")
    cfg = {**SETTINGS, **(settings or {})} if module == MODULE else dict(settings or {})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cmd = lambda i: [sys.executable, "-m", module, "--process-id",
                     str(i), "--processes", str(processes), "--port", str(port),
                     "--devices", str(devices_per_process), "--settings", json.dumps(cfg)]
    # Output goes to files, not pipes: a worker whose result overflows a 64 KiB pipe would block
    # on its print while its peers wait for it in jax.distributed's shutdown barrier.
    files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(processes)]
    procs = [subprocess.Popen(cmd(i), stdout=o, stderr=e, text=True, env=env)
             for i, (o, e) in enumerate(files)]
    try:
        for p in procs:
            p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        raise MlsysError(f"multi-process run: workers did not finish in {timeout:.0f} s "
                         f"(coordinator 127.0.0.1:{port})") from None
    outs = []
    for o, e in files:
        o.seek(0), e.seek(0)
        outs.append((o.read(), e.read()))
        o.close(), e.close()
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        if p.returncode != 0:
            tail = " | ".join(err.strip().splitlines()[-3:])
            raise MlsysError(f"multi-process run: worker {i} exited with {p.returncode}: {tail}")
    results = [json.loads(line[len(MARKER):]) for out, _ in outs
               for line in out.splitlines() if line.startswith(MARKER)]
    if len(results) != processes:
        raise MlsysError(f"multi-process run: got {len(results)} results from {processes} workers")
    same = all(r == results[0] for r in results[1:])
    return {**results[0], "ranks_agree": same}


def worker_args(argv=None) -> argparse.Namespace:
    """The arguments :func:`launch` gives every worker."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--settings", default="{}")
    return ap.parse_args(argv)


@contextlib.contextmanager
def joined(a: argparse.Namespace, x64: bool = True):
    """Set this worker's devices, join the coordinator (gloo CPU collectives), shut down after."""
    from mlsys_jax import runtime

    runtime.configure(devices=a.devices, x64=x64)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{a.port}", num_processes=a.processes,
                               process_id=a.process_id)
    try:
        yield
    finally:
        jax.distributed.shutdown()


def report(result: dict) -> None:
    """Print a worker's result as the one line :func:`launch` collects."""
    print(MARKER + json.dumps(result), flush=True)


def worker_main(argv=None) -> int:
    """Entry point of one worker process (``python -m mlsys_jax.parallel.multiprocess ...``)."""
    a = worker_args(argv)
    with joined(a, x64=True):
        cfg = {**SETTINGS, **json.loads(a.settings)}
        report(run_dp_demo(cfg["seed"], cfg["batch"], tuple(cfg["sizes"]), cfg["steps"],
                           cfg["lr"]))
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
