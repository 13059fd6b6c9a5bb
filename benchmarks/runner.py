"""``mlsys-jax bench [NAME ...] [--json]``: run the benchmarks side by side and report ratios.

Each ``benchmarks/bench_<name>.py`` exposes ``NAME`` and ``run(quick=False) -> dict`` returning
``{"figures": {...}, "notes": [...]}``: ratios measured in the same run (median of repeats after
warm-up, with min–max), or figures that carry their machine context. The runner adds the machine.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import re
import sys
import time

from benchmarks import discover, record_run  # JAX-free: bench --help reads them too
from mlsys_jax.errors import MlsysError
from mlsys_jax.results import to_jsonable
from mlsys_jax.tables import fmt, markdown_table, wrap


def machine() -> dict:
    """CPU, cores, JAX version and the device JAX measures on (every figure's context)."""
    import jax

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    dev = jax.devices()[0]
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "jax": jax.__version__, "platform": dev.platform,
            "device_kind": getattr(dev, "device_kind", dev.platform),
            "devices": jax.device_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = value


_BOUND = re.compile(r"(min|max|p\d+)(_us)?")  # a spread's ends: min–max, or percentiles


def _spread(v: dict) -> str:
    """``[low–high]`` of a figure's spread; percentiles are named (``[p10–p90: …]``)."""
    def rank(key):  # min = p0, max = p100
        end = key.split("_")[0]
        return {"min": 0, "max": 100}[end] if end in ("min", "max") else int(end[1:])
    ends = sorted((k for k in v if _BOUND.fullmatch(k)), key=rank)
    if len(ends) < 2:
        return ""
    lo, hi = ends[0], ends[-1]
    label = "" if lo.startswith("min") else f"{lo.split('_')[0]}–{hi.split('_')[0]}: "
    return f" [{label}{fmt(v[lo])}–{fmt(v[hi])}]"


def _cell(v) -> str:
    if isinstance(v, dict) and "ratio" in v:
        return fmt(v["ratio"]) + _spread(v)
    if isinstance(v, dict) and "median_us" in v:
        return f"{fmt(v['median_us'])} µs" + _spread(v)
    return fmt(v)


def markdown(report: dict, names: list[str]) -> str:
    """BENCHMARKS.md: every figure with its machine context and the command that produced it."""
    m = report["machine"]
    cmd = "mlsys-jax bench" + (" " + " ".join(names) if names != list(discover()) else "") + \
        " --json --md BENCHMARKS.md"
    out = ["# Benchmarks", "",
           f"Produced by `{cmd}` on {m['time']}: {m['cpu']}, {m['cores']} cores, Python "
           f"{m['python']}, jax {m['jax']}, {m['platform']} ({m['device_kind']} ×{m['devices']} "
           f"simulated devices); {report['seconds']} s in all.", "",
           "Every figure is a ratio measured side by side in one run (median of repeats after "
           "warm-up, [min–max] or the named percentiles over paired rounds) or carries its unit. "
           "The machine is shared, so absolute times vary from run to run; targets are stated "
           "as ratios.",
           ""]
    for name, res in report["benchmarks"].items():
        out += section(name, res)
    return "\n".join(out)


def section(name: str, res: dict, alone: str = "") -> list:
    """One benchmark's lines: its heading, ``alone`` (where it ran apart from the rest), its
    figures as a table, its notes."""
    flat: dict = {}
    _flatten("", res.get("figures", {}), flat)
    rows = {}
    for key, value in flat.items():  # fold {ratio,min,max} and timing dicts into one cell
        base, _, leaf = key.rpartition(".")
        if leaf in ("ratio", "median_us", "repeats", "number", "rounds") or _BOUND.fullmatch(leaf):
            rows.setdefault(base, {})[leaf] = value
        else:
            rows[key] = value
    out = [f"## {name} ({res.get('seconds')} s)", ""] + ([alone, ""] if alone else [])
    out += [markdown_table([{"figure": k, "value": _cell(v)} for k, v in rows.items()])]
    return out + [""] + [f"- {n}" for n in res.get("notes", [])] + [""]


def merged(old: str, report: dict) -> str:
    """``old`` (a BENCHMARKS.md) with the sections of ``report``'s benchmarks replaced (or
    appended), each saying it ran alone; the other sections are kept as they were."""
    m = report["machine"]
    parts = re.split(r"(?m)^(?=## )", old)
    head, sections = parts[0], {p.split()[1]: p for p in parts[1:]}
    for name, res in report["benchmarks"].items():
        alone = (f"This section alone: `mlsys-jax bench {name} --json` on {m['time']} ({m['cpu']}, "
                 f"{m['cores']} cores, jax {m['jax']}); the other sections are from the run "
                 "named at the top.")
        sections[name] = "\n".join(section(name, res, alone)) + "\n"
    return head + "".join(sections.values())


def main(args) -> int:
    available = discover()
    names = args.names or list(available)
    unknown = [n for n in names if n not in available]
    if unknown:
        raise MlsysError(f"unknown benchmark(s) {', '.join(unknown)}; available: {', '.join(available)}")
    quick = bool(getattr(args, "quick", False))
    results, total = {}, time.perf_counter()
    for name in names:
        if not args.json:
            print(f"[bench {name}] ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        out = importlib.import_module(available[name]).run(quick=quick)
        out = dict(out)
        out["seconds"] = round(time.perf_counter() - t0, 2)
        record_run(name, quick=quick, seconds=out["seconds"])  # bench --help shows it
        results[name] = out
    report = {"machine": machine(), "benchmarks": to_jsonable(results),
              "seconds": round(time.perf_counter() - total, 2)}
    if getattr(args, "md", None):
        whole = set(names) == set(available) or not os.path.exists(args.md)
        text = markdown(report, names) if whole else merged(open(args.md).read(), report)
        with open(args.md, "w") as f:  # a subset replaces its own sections only
            f.write(text)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    m = report["machine"]
    print(f"machine: {m['cpu']}, {m['cores']} cores, jax {m['jax']}, {m['device_kind']} "
          f"×{m['devices']}")
    for name, out in results.items():
        print(f"\n[{name}] ({out['seconds']} s)")
        flat: dict = {}
        _flatten("", out.get("figures", {}), flat)
        width = max((len(k) for k in flat), default=0)
        for k, v in flat.items():
            print(f"  {k.ljust(width)}  {fmt(v)}")
        for note in out.get("notes", []):
            print(wrap(note, first="  - "))
    print(f"\ntotal {report['seconds']} s")
    return 0
