"""The capture oracle: random branchy programs under ``capture``, compared bitwise with eager.

Each program (``capture_programs.py``) is called through one ``mlsys_jax.capture`` wrapper on a
sequence of inputs — the same inputs three times (a cold call that runs the Python, a warm call
that replays segment by segment, a replay of the whole guard tree as one program), then inputs
with flipped signs (new guard outcomes: -0.0 against 0.0 among them) three times, then the first
inputs again (the grown tree as one program) — and every
result is compared with the same function run eagerly: values bit for bit, dtypes, weak types,
Python values (floats by bit pattern), and raised errors by type. Calls that the bounded cache
sends back to eager are counted apart. A stateful program runs twice over, eagerly and captured,
each in globals of its own: its ``changes`` are made to both before calls ``CHANGE_AT``, and
after every call what its side effects did (the list it appends to, the counters, the printed
text) must be equal too.

NAN_NOTE: a NaN equals a NaN whatever its sign and payload. When both operands of an op are
NaN, which one propagates depends on XLA's kernel, not on the op: measured on XLA:CPU, ``a / b``
with a negative NaN in ``a`` and a positive NaN ``b`` broadcast from a scalar gives ``b``'s NaN in
eager's program and ``a``'s when the broadcast is its own kernel (float16, float32, float64).

CI runs 60 programs (``tests/execute/test_capture_fuzz.py``); the hand-run tier is
``python -m mlsys_jax.fuzz.capture_oracle --programs 2000 --seed 0``.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import time
from collections import Counter

import numpy as np

from mlsys_jax.fuzz.capture_programs import generate, inputs

# input variant per call: cold, warm (segment by segment), one program; the same with flipped
# signs (new outcomes); the first inputs again (the grown tree as one program)
CALLS = (0, 0, 0, 1, 1, 1, 0)
CHANGE_AT = (2, 5)  # a stateful program's globals change before these calls (one change each)


def _leaf_diff(got, want) -> str | None:
    import jax

    if isinstance(want, jax.Array) or isinstance(got, jax.Array):
        if not (isinstance(want, jax.Array) and isinstance(got, jax.Array)):
            return f"type {type(got).__name__} vs eager {type(want).__name__}"
        if (got.dtype, got.shape, got.weak_type) != (want.dtype, want.shape, want.weak_type):
            return (f"type {got.dtype}{list(got.shape)} weak={got.weak_type} vs eager "
                    f"{want.dtype}{list(want.shape)} weak={want.weak_type}")
        g, w = np.asarray(got).ravel(), np.asarray(want).ravel()
        gb, wb = (a.view(np.uint8).reshape(a.size, -1) for a in (g, w))
        differ = (gb != wb).any(axis=1)
        if g.dtype.kind in "fc" or str(g.dtype) == "bfloat16":  # NaN payloads: see NAN_NOTE
            differ &= ~(np.isnan(g) & np.isnan(w))
        if differ.any():
            i = int(np.flatnonzero(differ)[0])
            return (f"{int(differ.sum())} of {g.size} elements differ in bits, e.g. [{i}]: "
                    f"{g[i]!r} vs eager {w[i]!r}")
        return None
    if type(got) is not type(want):
        return f"Python value {got!r} vs eager {want!r}"
    if isinstance(want, float):
        same = struct.pack("<d", got) == struct.pack("<d", want) or (got != got and want != want)
        return None if same else f"{got!r} vs eager {want!r}"
    return None if got == want else f"{got!r} vs eager {want!r}"


def compare(got, want) -> str | None:
    """None if ``got`` equals eager's ``want`` bitwise (values, dtypes, weak types), else why."""
    import jax

    gl, gt = jax.tree_util.tree_flatten(got)
    wl, wt = jax.tree_util.tree_flatten(want)
    if gt != wt:
        return f"output structure {gt} vs eager {wt}"
    for i, (g, w) in enumerate(zip(gl, wl)):
        diff = _leaf_diff(g, w)
        if diff:
            return f"output {i}: {diff}"
    return None


def _outcome(fn, args):
    try:
        return fn(*args), None
    except Exception as e:  # noqa: BLE001 - the oracle compares errors too
        return None, type(e).__name__


def check(program, calls=CALLS) -> dict:
    """Run one program's call sequence; returns its modes and the first mismatch (or None)."""
    from mlsys_jax.execute import capture

    theirs, mine = program.namespace(), program.namespace()
    fn, captured = theirs["f"], capture(mine["f"])
    modes, before, changes = [], dict(captured.stats), list(program.changes)
    for i, variant in enumerate(calls):
        if i in CHANGE_AT and changes:
            change = changes.pop(0)
            for scope in (theirs, mine):
                exec(change, scope)  # noqa: S102 - the program's own statement
        args = inputs(program, variant)
        want, want_err = _outcome(fn, args)
        got, got_err = _outcome(captured, args)
        now = dict(captured.stats)
        mode = next((m for m in ("fused", "eager", "cold", "warm") if now[m] > before[m]),
                    "raised")
        before = now
        modes.append(mode)
        diff = (f"raised {got_err} vs eager {want_err}" if got_err != want_err
                else None if want_err else compare(got, want))
        effects = compare(program.state(mine), program.state(theirs))
        diff = diff or (f"side effects: {effects}" if effects else None)
        if diff:
            return {"seed": program.seed, "modes": modes, "mismatch":
                    f"call {i + 1} ({mode}, inputs {variant}): {diff}", "source": program.source,
                    "dtype": program.dtype, "n": program.n, "changes": program.changes}
    return {"seed": program.seed, "modes": modes, "mismatch": None}


def program_seed(seed: int, index: int) -> int:
    """The seed of program ``index`` of a run, so one program can be regenerated alone."""
    return seed * 1_000_003 + index


# The CI tier: fewer dtypes and sizes (eager's own compile cache warms up sooner), shorter
# programs, and four calls: cold, warm, one program, then flipped signs (a new outcome, or the
# one program on new inputs). Every tier draws stateful programs at STATE_RATE.
STATE_RATE = 0.4
CI_PROGRAMS = {"max_statements": 4, "dtypes": ("float32", "bfloat16"), "sizes": (1, 3)}
CI = {"calls": (0, 0, 0, 1), "generate": {**CI_PROGRAMS, "state_rate": STATE_RATE}}


def run_campaign(programs: int, seed: int = 0, time_budget: float | None = None,
                 first: int = 0, calls=CALLS, generate_options=None,
                 progress: bool = False) -> dict:
    """Check programs ``first .. first + programs - 1`` of a seed; a summary with every
    mismatch's reproducer source (``progress``: a line on stderr every 100 programs)."""
    t0, modes, mismatches, done, stateful = time.perf_counter(), Counter(), [], 0, 0
    for i in range(first, first + programs):
        if time_budget is not None and time.perf_counter() - t0 > time_budget:
            break
        options = {"state_rate": STATE_RATE} if generate_options is None else generate_options
        program = generate(program_seed(seed, i), **options)
        res = check(program, calls)
        done += 1
        stateful += program.stateful
        modes.update(res["modes"])
        if res["mismatch"]:
            mismatches.append(res)
        if progress and done % 100 == 0:
            print(f"capture oracle: {done}/{programs} programs, {len(mismatches)} mismatches, "
                  f"{time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {"programs": done, "requested": programs, "seed": seed, "stateful": stateful,
            "calls": sum(modes.values()), "modes": dict(modes), "mismatches": mismatches,
            "seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    """Command line: run random branchy programs under capture and eagerly, report mismatches; the exit code."""
    from mlsys_jax import runtime

    ap = argparse.ArgumentParser(prog="python -m mlsys_jax.fuzz.capture_oracle",
                                 description="random branchy programs under capture vs eager")
    ap.add_argument("--programs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0,
                    help="index of the first program (to split a campaign across processes)")
    ap.add_argument("--time-budget", type=float, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.programs < 1 or args.seed < 0 or args.first < 0:
        ap.error("--programs must be ≥ 1, --seed and --first ≥ 0")
    runtime.configure(devices=1, x64=True)
    res = run_campaign(args.programs, args.seed, args.time_budget, args.first, progress=True)
    if args.json:
        print(json.dumps(res, indent=1))
    else:
        print(f"capture oracle: {res['programs']} programs ({res['stateful']} stateful) × "
              f"{len(CALLS)} calls (seed {res['seed']}), {res['calls']} calls {res['modes']}, "
              f"{len(res['mismatches'])} mismatches, {res['seconds']} s")
        for m in res["mismatches"][:5]:
            print(f"\nprogram {m['seed']} ({m['dtype']}, n={m['n']}): {m['mismatch']}\n"
                  f"{m['source']}" + (f"changes between calls: {m['changes']}\n"
                                      if m['changes'] else ""))
    return 1 if res["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
