"""docs/verification.md §5 on the command line: every hostile input gets one line and exit 2 — never a
traceback, a hang or an OOM kill — and none of them reaches the catch-all for our own bugs.

Each case runs in-process (``cli.main``) and must finish in under 30 s with the process's peak
RSS rising by less than 2 GB; the cases that would allocate or run for minutes unchecked also run as real
processes, concurrently, each timed and its own peak RSS measured (``os.wait4`` in a launcher).
"""
import os
import resource
import socket
import subprocess
import sys
import time

import pytest

from mlsys_jax import cli
from mlsys_jax.errors import BUG_EXIT, BUG_NOTE, run_command

LIMIT_S, LIMIT_BYTES = 30.0, 2 << 30
PROGRAM = '''import jax, jax.numpy as jnp

def f(x):
    return jnp.sin(x) * 2.0

def nothing(x):
    jnp.sin(x)

def noise(x):
    return x + jax.random.normal(jax.random.key(0), x.shape, x.dtype)
'''


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    d = tmp_path_factory.mktemp("catalogue")
    (d / "prog.py").write_text(PROGRAM)
    (d / "a_file").write_text("")
    if os.geteuid() == 0:  # root writes through mode bits: use a place nobody can create files
        read_only = "/proc"
    else:
        read_only = str(d / "read_only")
        os.mkdir(read_only, 0o500)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield {"T": f"{d}/prog.py:f", "NONE": f"{d}/prog.py:nothing", "KEY": f"{d}/prog.py:noise",
               "DIR": str(d), "FILE": str(d / "a_file"), "RO": read_only,
               "PORT": str(s.getsockname()[1])}


# (name, argv with {placeholders}, what the one line must say)
CATALOGUE = [
    ("seed<0", "run 01 --set seed=-1", "seed must be ≥ 0"),
    ("batch<0", "run 03 --set batch=-1", "batch must be ≥ 1"),
    ("tokens=0", "run 04 --set tokens=0", "tokens must be ≥ 1"),
    ("batch=1e10", "run 01 --set batch=10000000000", "available on this machine"),
    ("n_layers=1e5", "run 03 --set n_layers=100000", "n_layers=100000 is too long"),
    ("report-is-a-file", "run 06 --report {FILE}", "is a file, not a folder"),
    ("report-read-only", "run 06 --report {RO}/report", "cannot write in"),
    ("dot-is-a-folder", "inspect {T} --arg f32[3] --dot {DIR}", "is a folder"),
    ("dot-read-only", "inspect {T} --arg f32[3] --dot {RO}/g.dot", "cannot write in"),
    ("dot-no-folder", "inspect {T} --arg f32[3] --dot {DIR}/missing/g.dot", "does not exist"),
    ("huge-arg", "optimize {T} --arg f32[1000000000,1000000000]", "available on this machine"),
    ("int64-overflow-arg", "optimize {T} --arg f32[9223372036854775808]", ""),
    ("devices=0", "run 04 --devices 0", "--devices"),
    ("devices=1e5", "run 04 --devices 100000", "from 1 to 1024"),
    ("ks-empty", "run 03 --set ks=", "ks needs 1 or more items"),
    ("width=0", "run 03 --set width=0", "width must be ≥ 1"),
    ("sizes=16", "run 04 --set sizes=16", "sizes needs 2 or more items"),
    ("grad-of-None", "inspect {NONE} --arg f32[3] --grad", "returns no array"),
    ("dtype=i32", "inspect {T} --arg f32[3] --dtype i32", "must be a float dtype"),
    ("port-taken", "run 04 --processes 2 --port {PORT}", "127.0.0.1:{PORT} is not available"),
    ("port-alone", "run 01 --port 5000", "--port"),
    ("s05-sizes-huge", "run 05 --set sizes=10,1000000000000", "available on this machine"),
    ("s06-hvp-huge", "run 06 --set hvp_n=10000000", "available on this machine"),
    ("s02-channels-huge", "run 02 --set small_shape=2,100000,10,10", "available on this machine"),
    ("s03-nested-remat", "run 03 --set jax_input_only_layers=64", "must be ≤ 16"),
    ("plots-is-a-file", "run 05 --set plots={FILE}", "is a file, not a folder"),
]
# the cases that allocated, ran for minutes or wrote after the run: also as real processes
SUBPROCESS = ("batch=1e10", "n_layers=1e5", "report-is-a-file", "huge-arg", "devices=0")
# Runs the CLI as its child and reports the child's peak RSS. A child forked from this (large)
# test process would be charged this process's RSS (Linux records the pre-exec address space in
# ru_maxrss); forked from this small launcher, the figure is the CLI's own, plus a few MB.
MEASURED = ("import os, subprocess, sys\n"
            "p = subprocess.Popen([sys.executable, '-m', 'mlsys_jax.cli', *sys.argv[1:]])\n"
            "_, status, usage = os.wait4(p.pid, 0)\n"
            "print(usage.ru_maxrss * 1024)\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")


def _argv(template: str, paths: dict) -> list:
    return [part.format(**paths) for part in template.split()]


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _peak_rise(fn):
    """fn() and how far the process's peak RSS rose above its RSS before (Linux: the peak is
    reset through /proc/self/clear_refs; elsewhere the rise of ru_maxrss, a lower bound)."""
    try:
        before = _status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        out = fn()
        return out, (_status_kb("VmHWM") - before) * 1024
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = fn()
        return out, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


def _assert_one_line(code: int, err: str, needle: str):
    lines = err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(lines) == 1 and lines[0].startswith("mlsys-jax: error: "), err
    assert "Traceback" not in err and BUG_NOTE not in err, err  # never the catch-all
    assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize("name,template,needle", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_hostile_input_gets_one_line_and_exit_2(capsys, paths, name, template, needle):
    t0 = time.monotonic()
    code, rise = _peak_rise(lambda: cli.main(_argv(template, paths)))
    seconds = time.monotonic() - t0
    _assert_one_line(code, capsys.readouterr().err, needle.format(**paths))
    assert seconds < LIMIT_S and rise < LIMIT_BYTES, (seconds, rise)


@pytest.mark.slow
def test_the_worst_cases_as_real_processes(paths):
    """End to end: exit 2, one line on stderr, in under 30 s, peak RSS under 2 GB — each case
    its own process, all started at once."""
    cases = {c[0]: c for c in CATALOGUE if c[0] in SUBPROCESS}
    running = {}
    for name, (_, template, _) in cases.items():
        argv = [sys.executable, "-c", MEASURED, *_argv(template, paths)]
        p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        running[name] = (p, time.monotonic())
    done = {}
    while running:
        for name, (p, t0) in list(running.items()):
            if p.poll() is not None:
                del running[name]
                out, err = p.communicate()
                done[name] = (p.returncode, err, time.monotonic() - t0, int(out.split()[-1]))
        assert all(time.monotonic() - t0 < 2 * LIMIT_S for _, t0 in running.values()), \
            f"still running: {list(running)}"
        time.sleep(0.02)
    for name, (code, err, seconds, peak) in done.items():
        _assert_one_line(code, err, cases[name][2].format(**paths))
        assert seconds < LIMIT_S and peak < LIMIT_BYTES, (name, seconds, peak)


@pytest.mark.parametrize("command", ["inspect", "optimize"])
def test_a_function_using_a_prng_key_is_never_a_bug(capsys, paths, command):
    """PRNG keys pass through: the command works, or says why in one line."""
    code = cli.main([command, paths["KEY"], "--arg", "f32[3]"])
    err = capsys.readouterr().err
    assert BUG_NOTE not in err and "Traceback" not in err, err
    assert code == 0 or (code == 2 and len(err.strip().splitlines()) == 1), (code, err)


def test_the_catch_all_names_a_bug_and_the_debug_switch(capsys, monkeypatch):
    monkeypatch.delenv("MLSYS_JAX_DEBUG", raising=False)
    assert run_command(lambda: {}["W0"]) == BUG_EXIT
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("mlsys-jax: error: KeyError: 'W0'")
    assert BUG_NOTE in err and "MLSYS_JAX_DEBUG=1" in err
    monkeypatch.setenv("MLSYS_JAX_DEBUG", "1")
    with pytest.raises(KeyError):
        run_command(lambda: {}["W0"])
