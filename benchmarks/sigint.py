"""Ctrl-C campaign: each long command, run N times, interrupted (SIGINT to its process group, as a
terminal's Ctrl-C) at a seeded random moment of its run, must end with exit 130 and one line
``mlsys-jax: interrupted`` — never a core dump (a signal exit: SIGSEGV, SIGABRT) or a traceback
(issue #39, item 7).

Not a ``bench_*`` benchmark (``mlsys-jax bench`` does not run it: it measures no speed); run it as
``python -m benchmarks.sigint --runs 10 --seed 0`` (``--only remat,pipeline`` for some commands).
Each command first runs once to the end, uninterrupted: that run must exit 0 (a segfault at exit
shows here) and its wall time bounds the moment of the interrupt, drawn uniformly from
(``EARLIEST_S``, ``SPAN`` × wall time). A run that ends before its signal is sent is tallied ``finished``, not
counted as interrupted. Every run gets a fresh ``XDG_CACHE_HOME``, so ``inspect --hw here``
measures its kernels each time instead of reading them from the cache.
"""
from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTERRUPTED = 130      # mlsys_jax.errors.INTERRUPTED, spelled here: importing it starts nothing
ONE_LINE = "mlsys-jax: interrupted"
EARLIEST_S = 0.3       # before this the interpreter may still be starting
SPAN = 0.9             # moments up to this share of the full run (a busy machine's runs vary)
# what a crash or an unhandled exception leaves on stderr
CRASH_WORDS = ("Traceback", "Fatal Python error", "FATAL", "Segmentation fault", "core dumped",
               "Aborted", "terminate called", "Exception ignored")

# `mlsys-jax ARGS` as a terminal runs it: Python's own SIGINT handler (a parent that ignores
# SIGINT, as a pytest-xdist worker does, would otherwise pass SIG_IGN on to the child)
AS_A_TERMINAL_RUNS_IT = ("import runpy, signal, sys; "
                         "signal.signal(signal.SIGINT, signal.default_int_handler); "
                         "sys.argv = ['mlsys-jax', *sys.argv[1:]]; "
                         "runpy.run_module('mlsys_jax.cli', run_name='__main__')")

COMMANDS = {
    "remat": ["remat", "examples/flax_transformer.py:loss", "--budget", "60%"],
    "shard": ["shard", "examples/flax_transformer.py:train", "--mesh", "data=2,model=2"],
    "pipeline": ["shard", "examples/pipeline_stacks.py:transformer8", "--mesh", "data=2,pipe=2",
                 "--microbatches", "4"],
    # a cold run of ~13 s here: the CI tier's moments (up to 8 s) fall inside it (the MLP's
    # ~4 s did not outlast them once its kernels were timed in shorter batches)
    "inspect-here": ["inspect", "examples/flax_resnet.py:inspect", "--hw", "here",
                     "--measure-budget", "30"],
}


def run_once(argv: list[str], *, interrupt_after_s: float | None, timeout_s: float = 600) -> dict:
    """Run ``mlsys-jax ARGV`` in a child with a fresh cache folder; SIGINT it after
    ``interrupt_after_s`` seconds (None: let it finish). Returns its exit status, wall time,
    stderr's last line, whether the signal was sent before it ended, and any crash words."""
    with tempfile.TemporaryDirectory(prefix="mlsys-sigint-") as cache, \
            tempfile.TemporaryFile("w+") as err:
        env = {**os.environ, "XDG_CACHE_HOME": cache, "PYTHONFAULTHANDLER": ""}
        env.pop("MLSYS_JAX_DEBUG", None)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-c", AS_A_TERMINAL_RUNS_IT, *argv], cwd=ROOT,
                                env=env, stdout=subprocess.DEVNULL, stderr=err,
                                preexec_fn=_default_sigint, process_group=0)
        sent = False
        if interrupt_after_s is not None:
            try:
                proc.wait(timeout=interrupt_after_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C: the whole process group
                sent = True
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        wall = time.monotonic() - t0
        err.seek(0)
        text = err.read()
    lines = text.rstrip().splitlines()
    return {"code": code, "wall_s": wall, "sent": sent, "last": lines[-1] if lines else "",
            "crash": sorted(w for w in CRASH_WORDS if w in text), "stderr_tail": text[-800:]}


def _default_sigint() -> None:
    """In the child before it starts: SIGINT's default action, as a terminal's process has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def clean_interrupt(run: dict) -> bool:
    """The run ended as a Ctrl-C must: 130, the one line last, nothing of a crash."""
    return run["code"] == INTERRUPTED and run["last"] == ONE_LINE and not run["crash"]


def campaign(name: str, argv: list[str], *, runs: int, rng: random.Random,
             horizon_s: float | None = None, log=None) -> dict:
    """One full run of ``argv`` (must exit 0; its time bounds the interrupt moments), then
    ``runs`` runs each interrupted at a random moment. Returns the tally. ``horizon_s`` given:
    no full run, the moments are drawn up to it (the CI tier's short runs)."""
    full = {"code": 0, "wall_s": 0.0, "crash": []}
    if horizon_s is None:
        full = run_once(argv, interrupt_after_s=None)
        if log:
            log(f"{name}: full run exit {full['code']} in {full['wall_s']:.1f} s"
                f"{', crash: ' + ','.join(full['crash']) if full['crash'] else ''}")
    horizon = max(horizon_s or SPAN * full["wall_s"], EARLIEST_S + 0.5)
    tally = {"name": name, "full_code": full["code"], "full_s": full["wall_s"],
             "full_crash": full["crash"], "codes": Counter(), "lasts": Counter(), "crashes": 0,
             "finished": 0, "clean": 0, "interrupted": 0, "bad": []}
    for i in range(runs):
        at = rng.uniform(EARLIEST_S, horizon)
        run = run_once(argv, interrupt_after_s=at)
        tally["codes"][run["code"]] += 1
        tally["lasts"][run["last"]] += 1
        tally["crashes"] += bool(run["crash"]) or run["code"] < 0
        if not run["sent"]:
            tally["finished"] += 1
        else:
            tally["interrupted"] += 1
            tally["clean"] += clean_interrupt(run)
            if not clean_interrupt(run):
                tally["bad"].append({"at_s": round(at, 2), **run})
        if log:
            log(f"{name} #{i + 1}: SIGINT at {at:.1f} s{'' if run['sent'] else ' (ended first)'}"
                f" -> exit {run['code']}, last line {run['last']!r}"
                f"{', crash: ' + ','.join(run['crash']) if run['crash'] else ''}")
    return tally


def rows(tallies: list[dict]) -> list[dict]:
    """One table row per command: runs interrupted, of them ended with 130 and the one line, runs
    that ended before their signal, runs with a crash or traceback, and every exit status."""
    return [{"command": t["name"], "full run": f"exit {t['full_code']} {t['full_s']:.0f} s",
             "SIGINT'd": t["interrupted"], "130+line": t["clean"], "ended first": t["finished"],
             "crashed": t["crashes"],
             "exit codes": " ".join(f"{c}×{n}" for c, n in sorted(t["codes"].items()))}
            for t in tallies]


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; exit 1 when any interrupted run ended otherwise than cleanly, or a full
    run did not exit 0."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.sigint", description=__doc__.split(
        "\n\n")[0])
    p.add_argument("--runs", type=int, default=10, help="interrupted runs per command")
    p.add_argument("--seed", type=int, default=0, help="seed of the interrupt moments")
    p.add_argument("--only", default=",".join(COMMANDS),
                   help=f"commands, comma-separated (of {', '.join(COMMANDS)})")
    args = p.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in COMMANDS]
    if unknown:
        p.error(f"unknown command(s) {', '.join(unknown)}: choose from {', '.join(COMMANDS)}")
    from mlsys_jax.tables import format_table

    rng = random.Random(args.seed)
    tallies = [campaign(n, COMMANDS[n], runs=args.runs, rng=rng,
                        log=lambda s: print(s, flush=True)) for n in names]
    print(format_table(rows(tallies), title=f"SIGINT campaign (seed {args.seed})"))
    for t in tallies:
        for bad in t["bad"]:
            print(f"{t['name']}: SIGINT at {bad['at_s']} s -> exit {bad['code']}:\n"
                  f"{bad['stderr_tail']}")
    ok = all(t["clean"] == t["interrupted"] and t["full_code"] == 0 and not t["full_crash"]
             for t in tallies)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
