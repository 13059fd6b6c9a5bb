"""The data-parallel step as N local processes through ``jax.distributed`` (gloo CPU collectives).

§5.1 at the scale where it matters: the same shard_map program, now spanning processes. Each
worker owns ``devices_per_process`` simulated CPU devices, joins a coordinator on 127.0.0.1, builds
the mesh over *all* processes' devices, feeds only its own slice of the batch
(``jax.make_array_from_process_local_data``) and runs :func:`data.make_dp_step`. Every worker
prints its result as one JSON line; :func:`launch` starts the workers, collects the lines and
checks that all ranks agree. JAX is imported inside functions: a worker must set its device
count (``runtime.configure``) before JAX starts.

Failing fast: the parent watches all workers at once (:func:`mlsys_jax.parallel.workers.supervise`)
and stops the run at the first failure, naming the worker and the cause; the coordinator's port is
checked before anything starts; a worker waits at most ``INIT_TIMEOUT_S`` for its coordinator and
peers, and the coordination service declares a silent peer dead after ``HEARTBEAT_S``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import socket
import sys
import time

import numpy as np

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import workers as W

MARKER = "MLSYS_JAX_RESULT "
JOINED = "MLSYS_JAX_JOINED"  # a worker prints it once every process has joined the coordinator
SETTINGS = {"seed": 0, "batch": 32, "sizes": (16, 32, 4), "steps": 2, "lr": 0.05}
HOST = "127.0.0.1"
RUN_TIMEOUT_S = 120.0   # the whole run (a 2-process demo run is well under it on 2 cores)
INIT_TIMEOUT_S = 15     # a worker has this long from its launch to join its coordinator and peers
MIN_WAIT_S = 2.0        # ... but at least this long after its own imports
HEARTBEAT_S = 15        # the coordination service declares a peer dead after this much silence
SHUTDOWN_TIMEOUT_S = 30
MODULE = "mlsys_jax.parallel.multiprocess"  # the default worker: the DP demo below


def run_dp_demo(seed: int, batch: int, sizes, steps: int, lr: float, mesh=None) -> dict:
    """Run ``steps`` DP steps (Adam) over ``mesh`` (default: every device of every process).

    Returns plain lists (losses, updated params and last gradients, flattened).
    """
    import jax
    import optax
    from jax.sharding import NamedSharding, PartitionSpec as P

    from mlsys_jax.models import mlp_loss
    from mlsys_jax.parallel.lecture.data import demo_problem, even_counts, flatten, make_dp_step, pad_shards
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
        s.bind((HOST, 0))
        return s.getsockname()[1]


def check_port(port: int) -> int:
    """``port`` if the coordinator can listen on it (MlsysError naming it otherwise)."""
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise MlsysError(f"coordinator port must be 1..65535, got {port!r}")
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError as e:
            raise MlsysError(f"coordinator port {HOST}:{port} is not available ({e.strerror}); "
                             "choose another port or leave it out for a free one") from None
    return port


def wait_for_coordinator(port: int, timeout_s: float) -> None:
    """Block until the coordinator listens on ``port`` (MlsysError after ``timeout_s``): JAX's
    own wait ends in a native abort with stack text, this one in one line."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((HOST, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise MlsysError(f"no coordinator listening on {HOST}:{port} after waiting "
                                 f"{timeout_s:.1f} s (is process 0 running?)") from None
            time.sleep(0.1)


def worker_command(index: int, processes: int, port: int, devices: int, settings: dict,
                   init_timeout_s: float = INIT_TIMEOUT_S, module: str = MODULE) -> list:
    """The command line of worker ``index`` (``python -m module``, whose entry point calls
    :func:`run_worker`): it must join by ``init_timeout_s`` from now (a wall-clock deadline, so the
    time JAX takes to import on a loaded machine is part of it, not added to it)."""
    return [sys.executable, "-m", module, "--process-id", str(index),
            "--processes", str(processes), "--port", str(port), "--devices", str(devices),
            "--settings", json.dumps(settings), "--join-by", f"{time.time() + init_timeout_s:.3f}"]


def worker_env() -> dict:
    """The parent's environment without XLA_FLAGS (each worker sets its own device count)."""
    return {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}


def launch(processes: int, devices_per_process: int, settings: dict | None = None,
           timeout: float = RUN_TIMEOUT_S, port: int | None = None, module: str = MODULE) -> dict:
    """Start ``processes`` workers on 127.0.0.1 and return process 0's result.

    ``module`` is run as ``python -m module`` (default: this module's DP demo; any entry point
    built on :func:`run_worker`), with ``settings`` as JSON. ``timeout`` bounds the whole run
    (seconds); ``port`` is the coordinator's (default: a free one). Raises MlsysError at the first
    failure, naming the worker and the cause."""
    if processes < 2:
        raise MlsysError(f"--processes must be >= 2 for a multi-process run, got {processes}")
    if devices_per_process < 1:
        raise MlsysError(f"each process needs >= 1 device, got {devices_per_process}")
    cfg = {**SETTINGS, **(settings or {})} if module == MODULE else dict(settings or {})
    port = free_port() if port is None else check_port(port)
    started = W.start([worker_command(i, processes, port, devices_per_process, cfg, module=module)
                       for i in range(processes)], env=worker_env())
    outs = W.supervise(started, timeout_s=timeout,
                       what=f"multi-process run (coordinator {HOST}:{port})")
    results = [json.loads(line[len(MARKER):]) for out in outs for line in out
               if line.startswith(MARKER)]
    if len(results) != processes:
        raise MlsysError(f"multi-process run: got {len(results)} results from {processes} workers")
    same = all(r == results[0] for r in results[1:])
    return {**results[0], "ranks_agree": same}


def _fail(message: str) -> int:
    print(W.ERROR_MARKER + message.replace("\n", " ")[:300], file=sys.stderr, flush=True)
    return 3


def worker_args(argv=None) -> argparse.Namespace:
    """The arguments :func:`launch` gives every worker (:func:`worker_command`)."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--process-id", type=int, required=True)
    ap.add_argument("--processes", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--devices", type=int, required=True)
    ap.add_argument("--settings", default="{}")
    ap.add_argument("--join-by", type=float, default=None, dest="join_by",
                    help="wall-clock time (seconds since the epoch) to have joined by")
    return ap.parse_args(argv)


class JoinError(RuntimeError):
    """This worker could not join its coordinator and peers in time."""


@contextlib.contextmanager
def joined(a: argparse.Namespace, x64: bool = True):
    """Set this worker's devices, join the coordinator (gloo CPU collectives) by ``--join-by``,
    and shut down after; a worker that cannot join raises JoinError at once, in one line."""
    join_by = time.time() + INIT_TIMEOUT_S if a.join_by is None else a.join_by
    left = lambda: max(join_by - time.time(), MIN_WAIT_S)  # noqa: E731
    from mlsys_jax import runtime

    runtime.configure(devices=a.devices, x64=x64)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    address = f"{HOST}:{a.port}"
    try:
        if a.process_id == 0:  # the coordinator listens here: JAX crashes if it cannot
            check_port(a.port)
        else:
            wait_for_coordinator(a.port, left())
        jax.distributed.initialize(address, num_processes=a.processes, process_id=a.process_id,
                                   initialization_timeout=math.ceil(left()),
                                   heartbeat_timeout_seconds=HEARTBEAT_S,
                                   shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
                                   coordinator_bind_address=address)
    except Exception as e:
        raise JoinError(f"worker {a.process_id} could not join the coordinator at {address}: "
                        f"{_first_line(e)}") from None
    # JAX's preemption notifier catches SIGTERM and runs on (a worker told to stop would leave
    # its peers waiting in a collective): restore the default, so SIGTERM ends this worker and
    # the parent reports it as that worker's failure
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print(JOINED, flush=True)
    try:
        yield
    finally:
        jax.distributed.shutdown()


def run_worker(body, argv=None, x64: bool = True) -> int:
    """The entry point of one worker: join, print ``body(args)`` (a JSON-able dict) as the line
    :func:`launch` collects, shut down. Any failure is one ``ERROR_MARKER`` line on stderr."""
    W.die_with_parent()
    a = worker_args(argv)
    try:
        with joined(a, x64):
            result = body(a)
            print(MARKER + json.dumps(result), flush=True)
    except JoinError as e:
        return _fail(str(e))
    except Exception as e:  # the worker's own failure, named in one line for the parent
        return _fail(f"{type(e).__name__}: {_first_line(e)}")
    return 0


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _dp_demo(a: argparse.Namespace) -> dict:
    cfg = {**SETTINGS, **json.loads(a.settings)}
    return run_dp_demo(cfg["seed"], cfg["batch"], tuple(cfg["sizes"]), cfg["steps"], cfg["lr"])


def worker_main(argv=None) -> int:
    """Entry point of one DP-demo worker (``python -m mlsys_jax.parallel.multiprocess ...``)."""
    return run_worker(_dp_demo, argv)


if __name__ == "__main__":
    sys.exit(worker_main())
