"""Multi-process launch: bad counts are clear errors, and a run fails fast naming the culprit.

The successful 2-process run is tested end to end in tests/experiments/test_s04.py (one launch of 2
workers is enough for the suite's time budget). Here: a killed or stopped worker ends the run
within 30 s naming that worker, a taken coordinator port is named before anything starts, and a
worker whose coordinator never comes ends on its own within 30 s. The lonely worker starts before
the module's first test (an autouse module fixture: the suite runs slow tests first, so a fixture
asked for by one test only would start with that test) and waits while the other tests run.
"""
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import make_mesh, multiprocess, workers

LIMIT_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def lonely_worker():
    """Worker 1 of 2, started with no coordinator on its port (nothing listens there); yields
    the process, its start time, the port and (once it ends) its end time."""
    port = multiprocess.free_port()
    t0 = time.monotonic()
    proc = subprocess.Popen(multiprocess.worker_command(1, 2, port, 1, multiprocess.SETTINGS),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=multiprocess.worker_env())
    ended: list = []
    waiter = threading.Thread(target=lambda: (proc.wait(), ended.append(time.monotonic())),
                              daemon=True)
    waiter.start()
    yield proc, t0, port, ended
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_bad_process_counts():
    with pytest.raises(MlsysError, match="--processes must be >= 2"):
        multiprocess.launch(1, 4)
    with pytest.raises(MlsysError, match=">= 1 device"):
        multiprocess.launch(2, 0)


@pytest.mark.slow
def test_one_process_demo_is_deterministic_and_mesh_independent():
    cfg = {**multiprocess.SETTINGS, "batch": 8, "sizes": (4, 6, 3), "steps": 1}
    import jax

    two = multiprocess.run_dp_demo(**cfg, mesh=make_mesh({"data": 2}, devices=jax.devices()[:2]))
    four = multiprocess.run_dp_demo(**cfg, mesh=make_mesh({"data": 4}, devices=jax.devices()[:4]))
    assert (two["devices"], four["devices"], two["processes"]) == (2, 4, 1)
    for key in ("losses", "grads", "params"):
        np.testing.assert_allclose(two[key], four[key], rtol=0, atol=1e-12)


def test_a_taken_coordinator_port_is_named_before_anything_starts():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(MlsysError, match=f"coordinator port 127.0.0.1:{port} is not available"):
            multiprocess.launch(2, 1, port=port)
        assert time.monotonic() - t0 < 1.0


def _joined_run(steps: int = 10**6):
    """Two workers of a run that would last for ever, once both have joined the coordinator."""
    port = multiprocess.free_port()
    cfg = {**multiprocess.SETTINGS, "steps": steps}
    started = workers.start([multiprocess.worker_command(i, 2, port, 1, cfg) for i in range(2)],
                            env=multiprocess.worker_env())
    deadline = time.monotonic() + 120
    while not all(multiprocess.JOINED in w.out for w in started):
        assert time.monotonic() < deadline and all(w.proc.poll() is None for w in started), \
            [w.err[-3:] for w in started]
        time.sleep(0.05)
    return port, started


@pytest.mark.slow
def test_a_stopped_worker_ends_the_run_naming_it():
    """SIGSTOP while both workers run: the other would wait in a collective for ever."""
    port, started = _joined_run()
    os.kill(started[1].proc.pid, signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(MlsysError) as e:
        workers.supervise(started, timeout_s=120, what=f"run (coordinator 127.0.0.1:{port})")
    assert time.monotonic() - t0 < LIMIT_S
    msg = str(e.value)
    assert f"worker 1 (pid {started[1].proc.pid}) is stopped" in msg and str(port) in msg, msg
    assert "stopped the other 1 worker" in msg and "\n" not in msg
    assert all(w.proc.poll() is not None for w in started)  # nobody is left behind


@pytest.mark.slow
def test_sigterm_to_a_worker_ends_the_run_as_that_workers_failure():
    """JAX's preemption notifier catches SIGTERM and runs on; a worker restores the default, so
    the run ends at once, naming the worker."""
    port, started = _joined_run()
    os.kill(started[1].proc.pid, signal.SIGTERM)
    t0 = time.monotonic()
    with pytest.raises(MlsysError) as e:
        workers.supervise(started, timeout_s=120, what=f"run (coordinator 127.0.0.1:{port})")
    assert time.monotonic() - t0 < LIMIT_S
    assert f"worker 1 (pid {started[1].proc.pid}) was killed by SIGTERM" in str(e.value)
    assert all(w.proc.poll() is not None for w in started)


@pytest.mark.slow
def test_cli_run_04_with_a_killed_worker_exits_nonzero_naming_it():
    """The contract end to end: `mlsys-jax run 04 --processes 2`, worker 1 killed."""
    cli = subprocess.Popen([sys.executable, "-m", "mlsys_jax.cli", "run", "04", "--processes",
                            "2", "--devices", "2"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        victim = _find_worker(cli.pid, index=1, timeout_s=120)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        _, err = cli.communicate(timeout=LIMIT_S)
        assert time.monotonic() - t0 < LIMIT_S
    finally:
        cli.kill()
    lines = err.strip().splitlines()
    assert cli.returncode == 2 and len(lines) == 1, err
    assert lines[0].startswith("mlsys-jax: error: multi-process run (coordinator 127.0.0.1:")
    assert f"worker 1 (pid {victim}) was killed by SIGKILL" in lines[0]


def _find_worker(parent: int, index: int, timeout_s: float) -> int:
    """The pid of worker ``index`` among ``parent``'s children (Linux /proc)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                kids = [int(p) for p in f.read().split()]
        except OSError:
            kids = []
        for pid in kids:
            try:
                with open(f"/proc/{pid}/cmdline") as f:
                    argv = f.read().split("\0")
            except OSError:
                continue
            if "--process-id" in argv and argv[argv.index("--process-id") + 1] == str(index):
                return pid
        time.sleep(0.02)
    pytest.fail(f"worker {index} of pid {parent} did not start in {timeout_s} s")


@pytest.mark.slow
def test_a_worker_whose_coordinator_never_comes_ends_within_30_s(lonely_worker):
    proc, t0, port, ended = lonely_worker
    _, err = proc.communicate(timeout=LIMIT_S)
    for _ in range(100):  # the waiter thread records the end time as the process is reaped
        if ended:
            break
        time.sleep(0.01)
    assert ended and ended[0] - t0 < LIMIT_S, (ended, t0)
    assert proc.returncode == 3
    lines = [line for line in err.splitlines() if line.startswith(workers.ERROR_MARKER)]
    assert len(lines) == 1 and f"no coordinator listening on 127.0.0.1:{port}" in lines[0], err
