"""Hostile input that needs a process of its own: user code that exits, interrupts, hangs or
leaves threads running, environment variables the tool and JAX read, and argparse's own usage
errors. Each case is a real process: exit 2 and one line ``mlsys-jax: error: ...`` (a usage error
adds one ``usage:`` hint line) — or a correct result — in under 30 s, with no traceback and a
peak RSS under 2 GB; a hanging import ends with its message within the bound.

The cases run concurrently, as children forked from one launcher that has imported the package
and JAX (but started no backend), so each pays only for its own work; each child leaves through
the same code path as ``python -m mlsys_jax.cli`` (``runpy``, then the interpreter's own exit,
which waits for non-daemon threads). A case about JAX's import-time reading of the environment
runs in a fresh interpreter instead.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from mlsys_jax.cli import user_code
from mlsys_jax.errors import BUG_NOTE, MlsysError, UsageError, env_flag, run_command

LIMIT_S, LIMIT_BYTES = 30.0, 2 << 30
IMPORT_BOUND_S = 3

FILES = {
    "prog.py": """
        import jax.numpy as jnp

        def f(x):
            return jnp.sin(x) * 2
    """,
    "model.txt": "def f(x):\n    return x\n",
    "exit0.py": "import sys\nsys.exit(0)\n",
    "exit3.py": "import sys\nsys.exit(3)\n",
    "os_exit.py": "import os\nos._exit(0)\n",
    "thread_raises.py": """
        import threading

        import jax.numpy as jnp

        threading.Thread(target=lambda: 1 / 0).start()

        def f(x):
            return jnp.sin(x) * 2
    """,
    "sleeps.py": "import time\ntime.sleep(3600)\n",
    "factories.py": """
        import sys
        import threading
        import time

        import jax.numpy as jnp

        def f(x):
            return jnp.sin(x) * 2

        def exits():
            raise SystemExit(5)

        def interrupts():
            raise KeyboardInterrupt

        def leaves_a_thread():
            threading.Thread(target=time.sleep, args=(3600,)).start()
            return f, (jnp.ones(3),)

        def exits_while_traced(x):
            sys.exit(4)
    """,
}

# (name, argv, environment, what the one error line must say; None: a correct result, exit 0)
CATALOGUE = [
    ("not-a-py-file", "inspect {d}/model.txt:f --arg f32[3]", {}, "is not a Python file"),
    ("x64-maybe", "inspect {d}/prog.py:f --arg f32[3]", {"JAX_ENABLE_X64": "maybe"},
     "JAX_ENABLE_X64='maybe' is not a truth value"),
    ("exit-0-at-import", "inspect {d}/exit0.py:f --arg f32[3]", {},
     "SystemExit(0) raised while importing"),
    ("exit-3-at-import", "inspect {d}/exit3.py:f --arg f32[3]", {},
     "SystemExit(3) raised while importing"),
    ("os-exit-at-import", "inspect {d}/os_exit.py:f --arg f32[3]", {},
     "os._exit(0) called while importing"),
    ("thread-raises-at-import", "inspect {d}/thread_raises.py:f --arg f32[3]", {}, None),
    ("SystemExit-in-factory", "inspect {d}/factories.py:exits", {},
     "SystemExit(5) raised while calling the factory"),
    ("KeyboardInterrupt-in-factory", "inspect {d}/factories.py:interrupts", {},
     "KeyboardInterrupt raised while calling the factory"),
    ("SystemExit-while-traced", "inspect {d}/factories.py:exits_while_traced --arg f32[3]", {},
     "SystemExit(4) raised while tracing"),
    ("import-sleeps-forever", f"inspect {{d}}/sleeps.py:f --import-timeout {IMPORT_BOUND_S}", {},
     f"waited {IMPORT_BOUND_S} s using no CPU (--import-timeout {IMPORT_BOUND_S})"),
    ("factory-leaves-a-thread", "inspect {d}/factories.py:leaves_a_thread", {}, None),
    ("f64-without-x64", "inspect {d}/prog.py:f --arg f64[3]", {}, "need --x64"),
    ("time-budget-nan", "fuzz --time-budget nan", {}, "--time-budget must be a positive, finite"),
    ("import-timeout-nan", "inspect {d}/prog.py:f --import-timeout nan", {},
     "argument --import-timeout: must be a positive, finite"),
    ("zero-7", "shard {d}/prog.py:f --mesh data=2 --zero 7", {},
     "shard: argument --zero: invalid choice: 7"),
    ("fused-and-unfused", "inspect {d}/prog.py:f --arg f32[3] --fused --unfused", {},
     "inspect: argument --unfused: not allowed with argument --fused"),
    ("unknown-option", "inspect {d}/prog.py:f --bogus", {}, "inspect: unrecognized arguments"),
    ("no-command", "", {}, "the following arguments are required: COMMAND"),
    ("debug-maybe", "inspect {d}/prog.py:f --arg f32[3]", {"MLSYS_JAX_DEBUG": "maybe"},
     "MLSYS_JAX_DEBUG='maybe' is not a truth value"),
    ("xla-device-count-abc", "inspect {d}/prog.py:f --arg f32[3]",
     {"XLA_FLAGS": "--xla_force_host_platform_device_count=abc"}, "is not a device count"),
    ("xla-unknown-flag", "inspect {d}/prog.py:f --arg f32[3]", {"XLA_FLAGS": "--no_such_flag"},
     "XLA refuses XLA_FLAGS"),
    ("xla-not-a-flag", "inspect {d}/prog.py:f --arg f32[3]", {"XLA_FLAGS": "eight"},
     "'eight' is not a flag"),
]
# JAX reads its own variables when it is imported: these need a fresh interpreter.
FRESH = [("jax-flag-2", "inspect {d}/prog.py:f --arg f32[3]", {"JAX_DEBUG_NANS": "2"},
          "JAX cannot read its environment (JAX_DEBUG_NANS)"),
         ("platform-missing", "inspect {d}/prog.py:f --arg f32[3]", {"JAX_PLATFORMS": "tpu"},
          "JAX could not start its backend")]
USAGE = {"import-timeout-nan", "zero-7", "fused-and-unfused", "unknown-option", "no-command"}

LAUNCHER = r'''
import json, os, runpy, sys, time
import jax  # noqa: F401 (imported once here, inherited by every forked case)
import mlsys_jax.cli.main as _main_module  # noqa: F401 (the package and its commands)
from mlsys_jax.cli.main import build_parser
build_parser()
cases, case = json.loads(sys.stdin.read()), None
running, done = {}, {}
for c in cases:
    pid = os.fork()
    if pid == 0:
        case = c
        break
    running[pid] = (c["name"], time.monotonic())
if case is not None:  # the child: becomes `python -m mlsys_jax.cli ARGV` with the case's env
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(os.open(case["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
    os.dup2(os.open(case["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
    os.chdir(case["cwd"])
    os.environ.update(case["env"])
    if case["fresh"]:
        os.execv(sys.executable, [sys.executable, "-m", "mlsys_jax.cli", *case["argv"]])
    sys.argv = ["mlsys-jax", *case["argv"]]
    runpy.run_module("mlsys_jax.cli", run_name="__main__", alter_sys=True)
else:
    deadline = time.monotonic() + float(sys.argv[1])
    while running:
        pid, status, usage = os.wait4(-1, os.WNOHANG)
        if pid:
            name, t0 = running.pop(pid)
            done[name] = {"status": os.waitstatus_to_exitcode(status),
                          "seconds": time.monotonic() - t0, "peak_bytes": usage.ru_maxrss * 1024}
        elif time.monotonic() > deadline:
            for pid, (name, _) in running.items():
                os.kill(pid, 9)
                done[name] = {"status": "killed: still running"}
            break
        else:
            time.sleep(0.01)
    print(json.dumps(done))
'''


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    d = tmp_path_factory.mktemp("process_cases")
    for name, text in FILES.items():
        (d / name).write_text(textwrap.dedent(text))
    cases = []
    for fresh, group in ((False, CATALOGUE), (True, FRESH)):
        for name, argv, env, _ in group:
            cases.append({"name": name, "argv": argv.format(d=d).split(), "env": env,
                          "fresh": fresh, "cwd": str(d), "out": str(d / f"{name}.out"),
                          "err": str(d / f"{name}.err")})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("MLSYS_JAX_DEBUG", None)
    run = subprocess.run([sys.executable, "-c", LAUNCHER, str(2 * LIMIT_S)], env=env,
                         input=json.dumps(cases), capture_output=True, text=True,
                         timeout=4 * LIMIT_S)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for c in cases:
        out[c["name"]]["stdout"] = (d / f"{c['name']}.out").read_text()
        out[c["name"]]["stderr"] = (d / f"{c['name']}.err").read_text()
    return out


def _problems(name: str, needle, r: dict) -> list:
    if not isinstance(r["status"], int):
        return [r["status"]]
    lines = r["stderr"].strip().splitlines()
    found = []
    if r["seconds"] >= LIMIT_S or r["peak_bytes"] >= LIMIT_BYTES:
        found.append(f"{r['seconds']:.1f} s, {r['peak_bytes'] / 2**20:.0f} MB")
    if "Traceback" in r["stderr"] or BUG_NOTE in r["stderr"]:
        found.append("a traceback or the catch-all")
    if needle is None:  # a correct result: inspect's table, exit 0, at most one note
        if r["status"] != 0 or "totals" not in r["stdout"] or len(lines) > 1:
            found.append(f"exit {r['status']}, not a result")
        return found
    usage_lines = 2 if name in USAGE else 1
    if r["status"] != 2 or not lines or not lines[0].startswith("mlsys-jax: error: ") \
            or needle not in lines[0] or len(lines) > usage_lines \
            or any(not line.startswith("usage: mlsys-jax") for line in lines[1:]):
        found.append(f"exit {r['status']}, stderr {lines}")
    return found


@pytest.mark.slow
def test_each_case_is_one_line_and_exit_2_as_a_real_process(results):
    failing = {name: p for name, _, _, needle in CATALOGUE + FRESH
               if (p := _problems(name, needle, results[name]))}
    assert failing == {}, failing
    hang = results["import-sleeps-forever"]["seconds"]
    assert IMPORT_BOUND_S <= hang < IMPORT_BOUND_S + 10, hang  # ended by the bound, not later
    note = results["factory-leaves-a-thread"]["stderr"]
    assert note.startswith("mlsys-jax: note: exiting without waiting for 1 thread"), note
    note = results["thread-raises-at-import"]["stderr"]
    assert note.startswith("mlsys-jax: note: ") and "ZeroDivisionError" in note, note


# ---- the same mechanisms in process, for the inner loop -----------------------------------

@pytest.mark.parametrize("value, want", [("1", True), ("TRUE", True), ("on", True), ("0", False),
                                         ("no", False), ("", False)])
def test_env_flags_read_as_jax_reads_them(monkeypatch, value, want):
    monkeypatch.setenv("MLSYS_JAX_DEBUG", value)
    assert env_flag("MLSYS_JAX_DEBUG") is want


def test_debug_flag_zero_means_off_and_a_bad_value_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("MLSYS_JAX_DEBUG", "0")  # off: the error is printed, not raised
    assert run_command(lambda: (_ for _ in ()).throw(MlsysError("bad"))) == 2
    assert capsys.readouterr().err == "mlsys-jax: error: bad\n"
    monkeypatch.setenv("MLSYS_JAX_DEBUG", "maybe")
    assert run_command(lambda: 0) == 2
    assert "MLSYS_JAX_DEBUG='maybe'" in capsys.readouterr().err


def test_a_usage_error_prints_its_one_hint_line(capsys):
    assert run_command(lambda: (_ for _ in ()).throw(UsageError("bad flag", "usage: x"))) == 2
    assert capsys.readouterr().err == "mlsys-jax: error: bad flag\nusage: x\n"


@pytest.mark.parametrize("raise_it, said", [
    (lambda: sys.exit(3), "SystemExit(3) raised while doing it"),
    (lambda: (_ for _ in ()).throw(KeyboardInterrupt()), "KeyboardInterrupt raised while doing it"),
    (lambda: {}["w"], "it failed: KeyError: 'w'"),
    (lambda: os._exit(3), "os._exit(3) called while doing it"),
])
def test_what_user_code_raises_becomes_its_failure(raise_it, said):
    with pytest.raises(MlsysError) as e:
        user_code.run(raise_it, "doing it", "it failed")
    assert str(e.value).startswith(said), str(e.value)


def test_user_code_runs_under_the_callers_float64_setting():
    import jax
    import jax.numpy as jnp

    for x64 in (False, True):
        with jax.enable_x64(x64):
            dtype = user_code.run(lambda: jnp.ones(1, float).dtype, "making an array", "failed")
        assert dtype == (jnp.float64 if x64 else jnp.float32)
