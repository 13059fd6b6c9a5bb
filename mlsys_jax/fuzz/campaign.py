"""A fuzzing campaign: random programs through every pass, judged by the oracles (docs/verification.md §4).

Each program is generated from ``program_seed(seed, i)``, traced, evaluated once (the reference),
then every pass runs on it through ``passes.run(..., verify=True)``; a pass that changed the
program is judged under its tier. Failures are shrunk and saved as reproducer files that pytest
runs (tests/regressions/).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from mlsys_jax.errors import MlsysError
from mlsys_jax.fuzz.judge import Failure, check_program
from mlsys_jax.fuzz.reproduce import save_reproducer, shrink
from mlsys_jax.fuzz.spec import Knobs, generate_seeded, program_seed
from mlsys_jax.passes import registry


@dataclass
class Summary:
    """docs/verification.md §4's figures for one campaign."""

    seed: int
    passes: list
    programs: int = 0
    valid: int = 0
    rejected: int = 0
    rejected_reasons: dict = field(default_factory=dict)
    per_pass: dict = field(default_factory=dict)
    verifier_failures: int = 0
    mismatches: int = 0
    crashes: int = 0
    fixpoint_failures: int = 0
    fixpoint_programs: int = 0
    validation_refusals: list = field(default_factory=list)  # [pass, program, reason]
    failures: list = field(default_factory=list)  # each one, in the order found
    worst_error_ratio: float = 0.0
    twin_checks: int = 0
    seconds: float = 0.0
    systems: dict = field(default_factory=dict)
    reproducers: list = field(default_factory=list)
    stopped_by_time_budget: bool = False

    def as_dict(self) -> dict:
        return {"programs": self.programs, "valid": self.valid, "rejected": self.rejected,
                "rejected_reasons": dict(self.rejected_reasons),
                "per_pass": {k: dict(v) for k, v in self.per_pass.items()},
                "verifier_failures": self.verifier_failures, "mismatches": self.mismatches,
                "crashes": self.crashes, "fixpoint_failures": self.fixpoint_failures,
                "fixpoint_programs": self.fixpoint_programs,
                "validation_refusals": [list(r) for r in self.validation_refusals],
                "worst_error_ratio": self.worst_error_ratio,
                "float64_twin_checks": self.twin_checks,
                "seed": self.seed, "seconds": round(self.seconds, 2),
                "systems": {k: dict(v) for k, v in self.systems.items()},
                "stopped_by_time_budget": self.stopped_by_time_budget,
                "failures": [{"pass": f.pass_name, "kind": f.kind, "program": f.program,
                              "message": f.message} for f in self.failures],
                "reproducers": list(self.reproducers)}


PROGRESS_EVERY = 500  # programs a stage line of progress covers


@dataclass(frozen=True, kw_only=True)
class CampaignOptions:
    """A campaign's settings. ``time_budget``: seconds, then it stops; ``out_dir``: where shrunk
    reproducers are saved (None: not saved); ``gradient_every``: every k-th program also checks
    gradients; ``knobs``: the generator's; ``stop_at_first_failure``; ``shrink_failures``;
    ``system_every``: every k-th program also runs one random remat case and one data-parallel
    step against their oracles (:mod:`mlsys_jax.fuzz.systems`; 0 turns that off);
    ``fixpoint_every``: every k-th program also repeats every pass and pipeline to a fixpoint
    (``judge.fixpoints``; 0: never); ``validate``: the passes run with translation validation,
    as users run them; the rewrites it refuses are listed (a correct rule proposes none but
    those its own dtype cannot hold).

    >>> CampaignOptions(system_every=0).gradient_every
    1
    """

    time_budget: float | None = None
    out_dir: str | None = None
    gradient_every: int = 1
    knobs: Knobs | None = None
    stop_at_first_failure: bool = False
    shrink_failures: bool = True
    system_every: int = 50
    fixpoint_every: int = 5
    validate: bool = True


DEFAULTS = CampaignOptions()


def run_campaign(programs: int = 300, seed: int = 0, passes=None, *,
                 options: CampaignOptions = DEFAULTS, first: int = 0, progress=None) -> Summary:
    """Generate ``programs`` random programs and run every pass on each (see module doc), with
    ``options`` (:class:`CampaignOptions`).

    Programs are numbered from ``first`` (to split one campaign over processes). ``progress``
    (a ``progress.Progress``): a stage line every ``PROGRESS_EVERY`` programs, each program as
    an item."""
    o = options
    time_budget, gradient_every, system_every = o.time_budget, o.gradient_every, o.system_every
    fixpoint_every, out_dir = o.fixpoint_every, o.out_dir
    if not isinstance(programs, int) or programs < 1:
        raise MlsysError(f"fuzz: --programs must be a positive integer, got {programs!r}")
    if time_budget is not None and time_budget <= 0:
        raise MlsysError(f"fuzz: --time-budget must be positive seconds, got {time_budget!r}")
    passes = passes if isinstance(passes, dict) else registry.instantiate(passes, "fuzz")
    s = Summary(seed, list(passes), per_pass={n: {"fired": 0, "rewrites": 0} for n in passes})
    t0, seen = time.perf_counter(), set()
    for i in range(first, first + programs):
        if time_budget is not None and time.perf_counter() - t0 > time_budget:
            s.stopped_by_time_budget = True
            break
        if progress is not None:
            done = i - first
            if done % PROGRESS_EVERY == 0:
                progress.stage(f"programs {done + 1}-{min(done + PROGRESS_EVERY, programs)} of "
                               f"{programs} (seed {seed})")
            progress.item(done + 1, programs, f"program {i}")
        pseed = program_seed(seed, i)
        if system_every and i % system_every == 0:
            _system_cases(s, pseed)
        spec = generate_seeded(pseed, o.knobs)
        probe = bool(fixpoint_every) and i % fixpoint_every == 0
        out = check_program(spec, passes, pseed, gradients=(i % max(gradient_every, 1) == 0),
                            validate=o.validate, fixpoint=probe)
        s.programs += 1
        if out.rejected:
            s.rejected += 1
            s.rejected_reasons[out.rejected] = s.rejected_reasons.get(out.rejected, 0) + 1
            continue
        s.valid += 1
        for name, n in out.rewrites.items():
            s.per_pass[name]["fired"] += n > 0
            s.per_pass[name]["rewrites"] += n
        s.worst_error_ratio = max(s.worst_error_ratio, out.error_ratio)
        s.twin_checks += out.twin_checks
        s.fixpoint_programs += probe
        s.validation_refusals += [(name, i, why) for name, why in out.validation]
        for f in out.failures:
            f.program = i
            s.verifier_failures += f.kind == "verifier"
            s.mismatches += f.kind == "mismatch"
            s.crashes += f.kind == "crash"
            s.fixpoint_failures += f.kind == "fixpoint"
            s.failures.append(f)
            if out_dir is not None and f.spec is not None and f.signature not in seen:
                seen.add(f.signature)  # one reproducer per distinct failure
                small = shrink(f, passes) if o.shrink_failures else f
                s.reproducers.append(save_reproducer(small, out_dir))
        if out.failures and o.stop_at_first_failure:
            break
    s.seconds = time.perf_counter() - t0
    return s


def _system_cases(s: Summary, pseed: int) -> None:
    """One remat and one data-parallel case (data parallel is skipped on a single device)."""
    from mlsys_jax.fuzz import systems

    for name, case in (("remat", systems.remat_case), ("data_parallel", systems.dp_case)):
        row = s.systems.setdefault(name, {"cases": 0, "failures": 0})
        fails = case(pseed)
        if fails is None:
            row["skipped"] = "needs at least 2 devices"
            continue
        row["cases"] += 1
        row["failures"] += len(fails)
        for msg in fails:
            s.mismatches += 1
            s.failures.append(Failure(name, "mismatch", msg, None, pseed))


def combine(parts: list) -> dict:
    """One summary dict from the summaries of a campaign split over processes (``first=``)."""
    out = dict(parts[0])
    for key in ("programs", "valid", "rejected", "verifier_failures", "mismatches", "crashes",
                "float64_twin_checks", "fixpoint_failures", "fixpoint_programs"):
        out[key] = sum(p.get(key, 0) for p in parts)
    out["seconds"] = max(p["seconds"] for p in parts)
    out["worst_error_ratio"] = max(p["worst_error_ratio"] for p in parts)
    out["stopped_by_time_budget"] = any(p["stopped_by_time_budget"] for p in parts)
    for key in ("rejected_reasons", "per_pass", "systems"):
        merged: dict = {}
        for p in parts:
            for k, v in p[key].items():
                if isinstance(v, dict):
                    row = merged.setdefault(k, {})
                    for kk, vv in v.items():
                        row[kk] = row.get(kk, 0) + vv if isinstance(vv, (int, float)) else vv
                else:
                    merged[k] = merged.get(k, 0) + v
        out[key] = merged
    out["failures"] = [f for p in parts for f in p["failures"]]
    out["validation_refusals"] = [r for p in parts for r in p["validation_refusals"]]
    out["reproducers"] = [r for p in parts for r in p["reproducers"]]
    return out


def _part(args) -> dict:
    first, n, seed, options, devices = args
    from mlsys_jax import runtime

    runtime.configure(devices=devices, x64=True)  # a fresh (spawned) process: before JAX starts
    return run_campaign(n, seed, options=options, first=first).as_dict()


def run_split(programs: int, seed: int = 0, workers: int = 2, *,
              options: CampaignOptions = DEFAULTS) -> dict:
    """The same campaign as ``run_campaign(programs, seed)``, split over ``workers`` processes
    (programs are seeded by index, so the union is identical); returns the combined summary."""
    import concurrent.futures
    import multiprocessing

    import jax

    if workers <= 1:
        return run_campaign(programs, seed, options=options).as_dict()
    bounds = [programs * k // workers for k in range(workers + 1)]
    jobs = [(lo, hi - lo, seed, options, jax.device_count()) for lo, hi in zip(bounds, bounds[1:])]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        return combine(list(pool.map(_part, jobs)))
