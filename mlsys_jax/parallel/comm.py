"""Communication volume from compiled HLO, beside the analytical ring formulas (lecture §5, §7.3).

XLA turns ``psum``/``all_gather``/``psum_scatter``/``ppermute`` into HLO collectives. We read them
from the *compiled* module text (after XLA's own rewrites, so what would run), take each one's
shapes, and charge it the bytes one device sends in a ring algorithm:

* all-reduce of S bytes over n devices: 2(n-1)/n * S  (reduce-scatter, then all-gather)
* all-gather to S bytes / reduce-scatter from S bytes: (n-1)/n * S
* collective-permute of S bytes: S (each device sends its buffer once)
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
# "%all-reduce.3 = (f32[4]{0}, f32[]) all-reduce(...)" or "... = f64[16,8]{1,0} all-gather(...)"
_LINE = re.compile(r"=\s*(?P<shape>\(.*?\)|\S+)\s+(?P<kind>" + "|".join(KINDS) +
                   r")(?:-start)?\((?P<rest>.*)$")
_ARRAY = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")


@dataclass(frozen=True)
class Collective:
    """One collective in compiled HLO: its kind, result bytes, and group size.

    ``groups`` are the device groups (logical device ids, the mesh's flat device order) when the
    HLO spells them; ``scalar_bytes`` is the part of ``result_bytes`` held by rank-0 arrays
    (a loss or a norm that XLA's combiner packed into the same collective as a gradient).
    """

    kind: str
    result_bytes: int
    group_size: int
    groups: tuple = ()
    scalar_bytes: int = 0
    op_name: str = ""      # the JAX operation it came from (HLO metadata), e.g. ".../dot_general"
    trips: int = 1         # times it runs per call: the known trip counts of the loops around it
    trips_known: bool = True  # False inside a while loop whose trip count XLA does not know

    @property
    def ring_bytes(self) -> float:
        """Bytes one device sends for this collective in a ring algorithm."""
        return ring_bytes(self.kind, self.result_bytes, self.group_size)


def ring_bytes(kind: str, result_bytes: float, n: int) -> float:
    """Per-device bytes sent by a ring collective whose *result* is ``result_bytes`` on n devices.

    >>> ring_bytes("all-reduce", 1000, 4), ring_bytes("all-gather", 1000, 4)
    (1500.0, 750.0)
    """
    if kind == "collective-permute":
        return float(result_bytes)  # each device sends its buffer once, whatever the pairs
    if n <= 1:
        return 0.0
    if kind == "all-reduce":
        return 2 * (n - 1) / n * result_bytes
    if kind == "all-gather":
        return (n - 1) / n * result_bytes
    if kind == "reduce-scatter":
        return (n - 1) * result_bytes  # the input is n times the result
    if kind == "all-to-all":
        return (n - 1) / n * result_bytes
    raise ValueError(f"unknown collective kind {kind!r}")


def hlo_text(fn, *args) -> str:
    """Compiled HLO text of a jitted function (or anything with ``.lower``) at ``args``."""
    lowered = fn.lower(*args) if hasattr(fn, "lower") else fn
    compiled = lowered.compile() if hasattr(lowered, "compile") else lowered
    return compiled.as_text()


def collectives(hlo: str, n_devices: int | None = None) -> list[Collective]:
    """Every collective op in compiled HLO text (``-start`` halves of async pairs counted once),
    each with the number of times it runs per call (a scan over layers is a ``while`` loop: an
    FSDP all-gather in its body runs once per layer)."""
    out = []
    trips = computation_trips(hlo)
    computation = None
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            computation = header["name"]
            continue
        m = _LINE.search(line)
        if not m or "-done(" in line:
            continue
        shape = m["shape"]
        if m["kind"] != "all-reduce" and shape.startswith("(") and "-start" in line:
            shape = shape.rsplit(",", 1)[-1]  # async start tuples hold (input, output): take output
        arrays = [(_DTYPE_BYTES[dt], [int(d) for d in dims.split(",") if d])
                  for dt, dims in _ARRAY.findall(shape)]
        nbytes = sum(b * math.prod(dims) for b, dims in arrays)
        groups = replica_groups(m["rest"])
        size = len(groups[0]) if groups else _group_size(m["rest"], n_devices)
        op = re.search(r'op_name="([^"]*)"', m["rest"])
        runs, known = trips.get(computation, (1, True))
        out.append(Collective(m["kind"], nbytes, size, groups,
                              sum(b for b, dims in arrays if not dims), op[1] if op else "",
                              runs, known))
    return out


# "%region_0.4 (param: f32[2]) -> f32[2] {" or "ENTRY %main.5 (...) -> ... {"
_COMPUTATION = re.compile(r"^(?P<entry>ENTRY )?%(?P<name>[\w.\-]+) .*\{\s*$")
_CALLED = re.compile(r"(?:body|condition|to_apply|calls|true_computation|false_computation)"
                     r"=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def computation_trips(hlo: str) -> dict[str, tuple[int, bool]]:
    """Each computation of an HLO module: how many times it runs per call of the entry, and
    whether every loop around it has a known trip count (XLA's ``known_trip_count``)."""
    calls: dict[str, list] = {}   # computation -> [(callee, times, known)]
    entry, current = None, None
    for line in hlo.splitlines():
        header = _COMPUTATION.match(line)
        if header:
            current = header["name"]
            calls[current] = []
            entry = current if header["entry"] else entry
            continue
        if current is None:
            continue
        n = _TRIP_COUNT.search(line)
        is_while = " while(" in line
        body = re.search(r"body=%([\w.\-]+)", line) if is_while else None
        for callee in _CALLED.findall(line):
            looped = body is not None and callee == body[1]
            calls[current].append((callee, int(n[1]) if looped and n else 1,
                                   not looped or n is not None))
        for group in _BRANCHES.findall(line):
            calls[current] += [(c.strip().lstrip("%"), 1, True) for c in group.split(",")]
    trips = {entry: (1, True)} if entry else {}
    todo = [entry] if entry else []
    while todo:
        here = todo.pop()
        runs, known = trips[here]
        for callee, times, sure in calls.get(here, ()):
            if callee in calls and callee not in trips:
                trips[callee] = (runs * times, known and sure)
                todo.append(callee)
    return trips


def collective_counts(hlo: str) -> Counter:
    """How many collectives of each kind the compiled HLO holds."""
    return Counter(c.kind for c in collectives(hlo))


def ring_total(colls: list[Collective]) -> float:
    """Sum of per-device ring bytes over a list of collectives."""
    return float(sum(c.ring_bytes for c in colls))


def replica_groups(rest: str) -> tuple:
    """The device groups of one collective's HLO attributes, in any of XLA's three spellings.

    ``{{0,1},{2,3}}`` (explicit), ``[2,2]<=[2,2]T(1,0)`` (iota: ids reshaped, transposed, cut
    into rows) and ``mesh['axis_0'=2,'axis_1'=2] {'axis_0'}`` (ids laid out on a mesh, grouped
    along the named axes; ``device_ids=([2,2]T(1,0))`` permutes the ids first). Returns ``()``
    when the line names no groups.
    """
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)+)\}", rest)
    if m:
        return tuple(tuple(int(t) for t in g.split(",") if t)
                     for g in re.findall(r"\{([\d,]*)\}", m[1]))
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", rest)
    if m:
        shape = [int(d) for d in m[1].split(",")]
        ids = np.arange(math.prod(shape)).reshape([int(d) for d in m[2].split(",")])
        if m[3]:
            ids = ids.transpose([int(d) for d in m[3].split(",")])
        return tuple(map(tuple, ids.reshape(-1, shape[-1]).tolist()))
    m = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([^)]*\)?)\))?\s*\{([^}]*)\}",
                  rest)
    if m:
        axes = re.findall(r"'(\w+)'=(\d+)", m[1])
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        grouped = [names.index(a) for a in re.findall(r"'(\w+)'", m[3])]
        ids = _device_ids(m[2], math.prod(sizes)).reshape(sizes)
        ids = np.moveaxis(ids, grouped, range(len(sizes) - len(grouped), len(sizes)))
        return tuple(map(tuple, ids.reshape(-1, math.prod(sizes[i] for i in grouped)).tolist()))
    return ()


def _device_ids(spec: str | None, n: int) -> np.ndarray:
    """A mesh's logical device ids: ``None`` (0..n-1), ``[2,2]T(1,0)`` (iota) or ``0,2,1,3``."""
    if not spec:
        return np.arange(n)
    m = re.match(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", spec)
    if m:
        ids = np.arange(n).reshape([int(d) for d in m[1].split(",")])
        return (ids.transpose([int(d) for d in m[2].split(",")]) if m[2] else ids).reshape(-1)
    return np.array([int(t) for t in re.findall(r"\d+", spec)])


def _group_size(rest: str, n_devices: int | None) -> int:
    m = re.search(r"source_target_pairs=\{(.*?)\}\}", rest)
    if m:
        return len(m[1].split("},{"))
    return int(n_devices or 1)


def nbytes(tree) -> int:
    """Total bytes of a pytree of arrays (or ShapeDtypeStructs)."""
    import jax

    return int(sum(np.dtype(l.dtype).itemsize * math.prod(l.shape) for l in jax.tree.leaves(tree)))


# For demo-sized programs LLVM's optimisation costs more time than it saves. XLA's HLO passes
# still run, so the collectives and buffer sizes read from the result are the same (checked in
# tests/parallel/test_comm.py); only the generated machine code is less optimised.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}
# And with XLA:CPU's elemental emitters instead of its fusion emitters: the same collectives and
# computations, compiled in about half the time or less, but not the same buffers (a few bytes
# of temp differ from the default compile): for figures of collectives and values (tests,
# benchmarks), never for memory.
FAST_COMPILE = {**QUICK_COMPILE, "xla_cpu_use_fusion_emitters": False}


def compile_and_run(fn, *args, options: dict | None = None):
    """Compile ``fn`` once at ``args`` (XLA ``options``) and run it: ``(outputs, compiled)``.

    ``compiled.as_text()`` is the HLO, ``compiled.memory_analysis()`` the per-device bytes;
    calling the jitted function after ``.lower().compile()`` would compile a second time.
    """
    compiled = fn.lower(*args).compile(options)
    return compiled(*args), compiled
