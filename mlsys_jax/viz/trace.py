"""Chrome trace-event JSON, the file ``--trace OUT.json`` writes: open it in Perfetto
(ui.perfetto.dev) or chrome://tracing.

The Trace Event Format's *JSON Object Format*: ``{"traceEvents": [...], "displayTimeUnit": "ms",
"otherData": {...}}``. Three phases are used:

* ``ph: "X"``, a complete event: a slice ``name`` (category ``cat``) on the track ``(pid, tid)``
  from ``ts`` for ``dur`` microseconds, with ``args`` shown when it is selected;
* ``ph: "C"``, a counter event: at ``ts``, the numbers in ``args`` (one track per ``name``);
* ``ph: "M"``, metadata: ``process_name`` / ``thread_name`` (``args.name``) name the tracks,
  ``thread_sort_index`` orders them.

Events are built from rows (a pipeline's executed timeline, a memory timeline's points, a cost
report's kernels) by the builders below, and :func:`write` writes one file. Not every axis is
time: a pipeline's schedule slots and a program's equation positions are drawn :data:`UNIT_US`
apart, so the viewer's milliseconds count units; every event says in ``args["time"]`` whether its
time is measured, estimated or a schedule unit.

>>> events = [thread_name(1, 1, "stage 1"), complete("F1", ts=0, dur=UNIT_US, pid=1, tid=1)]
>>> problems(document(events))
[]
>>> problems({"traceEvents": [{"ph": "X", "name": "F1"}]})
["event 0 (X 'F1'): no 'ts', 'dur', 'pid', 'tid'"]
"""
from __future__ import annotations

import json
import numbers
from typing import Iterable, Mapping, Sequence

UNIT_US = 1000  # one schedule slot or equation position on the time axis: 1 ms reads as 1 unit
SLOT_TIME = "schedule slot, not measured: 1 slot is drawn as 1 ms"
POSITION_TIME = "position in the step, not measured: 1 equation is drawn as 1 ms"
NEEDS = {"X": ("name", "ts", "dur", "pid", "tid"), "C": ("name", "ts", "pid", "args"),
         "M": ("name", "pid", "args")}
TRACK_NAMES = ("process_name", "thread_name", "process_sort_index", "thread_sort_index")


# ---- events -----------------------------------------------------------------------------------

def complete(name: str, *, ts: float, dur: float, pid: int, tid: int, cat: str = "",
             args: Mapping | None = None) -> dict:
    """A slice on track ``(pid, tid)``: ``ts`` and ``dur`` in microseconds."""
    return {"name": name, "cat": cat, "ph": "X", "ts": ts, "dur": dur, "pid": pid, "tid": tid,
            "args": dict(args or {})}


def counter(name: str, *, ts: float, pid: int, values: Mapping[str, float],
            cat: str = "") -> dict:
    """A counter sample: the track ``name`` of process ``pid`` reads ``values`` from ``ts`` on."""
    return {"name": name, "cat": cat, "ph": "C", "ts": ts, "pid": pid, "tid": 0,
            "args": {k: float(v) for k, v in values.items()}}


def process_name(pid: int, name: str) -> dict:
    return {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}


def thread_name(pid: int, tid: int, name: str) -> dict:
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def thread_sort(pid: int, tid: int, index: int) -> dict:
    """Tracks are shown by this index (Perfetto and chrome://tracing otherwise sort by tid)."""
    return {"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
            "args": {"sort_index": index}}


def document(events: Sequence[dict], *, other: Mapping | None = None) -> dict:
    """The JSON Object Format: the events, the display unit, and ``otherData`` (shown by
    chrome://tracing's metadata view)."""
    return {"traceEvents": list(events), "displayTimeUnit": "ms", "otherData": dict(other or {})}


def problems(doc) -> list[str]:
    """What in ``doc`` the format's documented fields do not allow (empty: a valid file):
    ``traceEvents`` a list, every event a ``ph``, X events ``ts``/``dur``/``pid``/``tid``
    (``dur`` >= 0), C events numeric ``args``, M events naming a process or thread."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["no 'traceEvents' list"]
    out = []
    for i, e in enumerate(doc["traceEvents"]):
        ph = e.get("ph") if isinstance(e, dict) else None
        where = f"event {i} ({ph} {e.get('name')!r})" if ph else f"event {i}"
        if ph not in NEEDS:
            out.append(f"{where}: 'ph' is {ph!r}, not one of {', '.join(NEEDS)}")
            continue
        missing = [k for k in NEEDS[ph] if k not in e]
        if missing:
            out.append(f"{where}: no {', '.join(map(repr, missing))}")
        elif ph == "X" and not (_number(e["dur"], e["ts"]) and e["dur"] >= 0):
            out.append(f"{where}: ts and dur must be numbers, dur >= 0")
        elif ph == "C" and not (e["args"] and _number(*e["args"].values())):
            out.append(f"{where}: a counter's args must be numbers")
        elif ph == "M" and (e["name"] not in TRACK_NAMES or not e["args"]):
            out.append(f"{where}: metadata must be one of {', '.join(TRACK_NAMES)}, with args")
    return out


def _number(*xs) -> bool:
    return all(isinstance(x, numbers.Real) and not isinstance(x, bool) for x in xs)


def write(path: str, events: Sequence[dict], *, other: Mapping | None = None) -> str:
    """Write the trace file (the caller checked ``path`` before its work); returns ``path``.
    A document the format does not allow is our bug, not the user's: AssertionError."""
    doc = document(events, other=other)
    found = problems(doc)
    if found:
        raise AssertionError(f"trace events break the format: {found[0]}")
    with open(path, "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
    return path


# ---- builders: rows -> events -----------------------------------------------------------------

KIND = {"F": "forward", "B": "backward"}


def pipeline_events(timeline: Sequence[Sequence[str | None]], *,
                    devices: Sequence[Sequence[object]], stage_us: Sequence[float] = (),
                    title: str = "pipeline") -> list[dict]:
    """One process per data replica, one track per stage (its device), one slice per schedule
    slot: ``F3``/``B3`` (forward/backward of microbatch 3) or ``bubble`` (the stage idles).

    ``timeline[step][stage]`` holds the executed cells (``PipelineReport.timeline``);
    ``devices[replica][stage]`` the device of each track (every replica runs the same
    schedule); ``stage_us`` each stage's estimated forward + backward µs of one microbatch."""
    events = []
    for r, row in enumerate(devices):
        pid = r + 1
        events.append(process_name(pid, f"{title}, data replica {r}" if len(devices) > 1
                                   else title))
        for s, device in enumerate(row):
            events += [thread_name(pid, s + 1, f"stage {s + 1} (device {device})"),
                       thread_sort(pid, s + 1, s)]
            events += [_slot(step[s], t, pid, s, device, stage_us)
                       for t, step in enumerate(timeline)]
    return events


def _slot(cell: str | None, t: int, pid: int, s: int, device, stage_us) -> dict:
    args = {"slot": t, "stage": s + 1, "device": device, "time": SLOT_TIME}
    if s < len(stage_us):
        args["stage estimate, forward + backward of one microbatch (µs)"] = stage_us[s]
    if cell is None:
        return complete("bubble", ts=t * UNIT_US, dur=UNIT_US, pid=pid, tid=s + 1, cat="bubble",
                        args=args)
    args["microbatch"] = int(cell[1:])
    return complete(cell, ts=t * UNIT_US, dur=UNIT_US, pid=pid, tid=s + 1, cat=KIND[cell[0]],
                    args=args)


def memory_events(series: Mapping[str, tuple[Sequence[float], Sequence[float]]], *,
                  title: str = "live activation bytes") -> list[dict]:
    """One counter track per series (label -> (positions, bytes): ``remat``'s memory timelines,
    the forward then the backward of the step), and a track marking the two halves."""
    events = [process_name(1, title), thread_name(1, 1, "phase"), thread_sort(1, 1, 0)]
    for label, (xs, ys) in series.items():
        events += [counter(label, ts=x * UNIT_US, pid=1, values={"bytes": y}, cat="memory")
                   for x, y in zip(xs, ys)]
    n = max((max(xs) for xs, _ in series.values() if len(xs)), default=0) / 2
    if n:
        events += [complete(half, ts=k * n * UNIT_US, dur=n * UNIT_US, pid=1, tid=1, cat="phase",
                            args={"equations": int(n), "time": POSITION_TIME})
                   for k, half in enumerate(("forward", "backward"))]
    return events


def kernel_events(rows: Iterable[Mapping], *, track: str, measured_us: float | None = None,
                  measured_what: str = "") -> list[dict]:
    """The kernels one after another on one track, each as long as its time: rows of ``name``,
    ``module``, ``time_us``, ``time`` (what the time is) and any other fields (shown as args);
    with ``measured_us``, the whole function's measured time on a second track."""
    events = [process_name(1, "inspect"), thread_name(1, 1, track), thread_sort(1, 1, 0)]
    ts = 0.0
    for row in rows:
        name = f"{row['name']} [{row['module']}]" if row.get("module") else row["name"]
        events.append(complete(name, ts=ts, dur=row["time_us"], pid=1, tid=1,
                               cat=row.get("module") or "kernel",
                               args={k: v for k, v in row.items() if k != "name"}))
        ts += row["time_us"]
    if measured_us is not None:
        events += [thread_name(1, 2, measured_what), thread_sort(1, 2, 1),
                   complete("whole function", ts=0.0, dur=measured_us, pid=1, tid=2,
                            cat="measured", args={"time": measured_what,
                                                  "kernels' sum (µs)": ts})]
    return events
