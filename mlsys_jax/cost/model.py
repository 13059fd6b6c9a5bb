"""The lecture's roofline cost model over the op view (§4.2, §8.1 demo 2).

Kernels: *unfused* — one kernel per op of the op view; *fused* — the hardware's fusion model
(:mod:`mlsys_jax.cost.fusion`: the lecture's adjacent runs of non-contraction ops on the GPU
models, XLA:CPU's loop fusion on ``cpu``); a named call is one kernel only when its body is one.
A kernel's bytes are its external inputs read plus outputs written; values inside a fused kernel
cost nothing. Per kernel: ``time = max(flops / peak, bytes / bandwidth) + launch``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import jax.numpy as jnp
import numpy as np

from mlsys_jax.compat import Var
from mlsys_jax.cost.fusion import call_is_one_kernel, group, is_free
from mlsys_jax.cost.hardware import Hardware, get_hardware
from mlsys_jax.cost.loops import static_trips, uncounted_whiles
from mlsys_jax.cost.flop_rules import FLOP_RULES, known
from mlsys_jax.errors import MlsysError
from mlsys_jax.ir.opview import Op, consumers, op_view, open_calls
from mlsys_jax.ir.primitives import FREE
from mlsys_jax.ir.trace import aval_bytes, parse_dtype, shape_str
from mlsys_jax.ir.walk import bodies

_SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64",
          "int8": "i8", "float8_e4m3fn": "f8", "float8_e5m2": "f8"}


@dataclass(frozen=True)
class Cost:
    """FLOPs and bytes; costs add up."""

    flops: int = 0
    bytes: int = 0
    unknown: frozenset = frozenset()

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.flops + other.flops, self.bytes + other.bytes, self.unknown | other.unknown)


def dtype_name(dtype) -> str:
    """``f32``, ``bf16``, ...; an extended dtype (a PRNG key's ``key<fry>``) by its own name."""
    import jax

    if jax.dtypes.issubdtype(dtype, jax.dtypes.extended):
        return str(dtype)
    name = np.dtype(dtype).name
    return _SHORT.get(name, name)


def eqn_flops(eqn) -> tuple[int, frozenset]:
    """FLOPs of one equation (recursively into bodies: scan × length, cond = costliest branch,
    while × its trip count where literals fix it, else one trip: :mod:`mlsys_jax.cost.loops`)
    and the unknown primitives."""
    prim = eqn.primitive.name
    if prim in FLOP_RULES:
        return int(FLOP_RULES[prim](eqn)), frozenset()
    if not known(prim):
        return 0, frozenset({prim})
    found = bodies(eqn)
    inner = [_jaxpr_flops(b.jaxpr) for b in found]
    unknown = frozenset().union(*(u for _, u in inner)) if inner else frozenset()
    flops = [f for f, _ in inner]
    if prim == "cond":
        return max(flops, default=0), unknown
    total = sum(flops)
    if prim == "scan":
        total *= int(eqn.params["length"])
    if prim == "while" and (trips := static_trips(eqn)) is not None:
        per = {b.param: f for b, f in zip(found, flops)}
        total = per["cond_jaxpr"] * (trips + 1) + per["body_jaxpr"] * trips
    return total, unknown


def _jaxpr_flops(jaxpr) -> tuple[int, frozenset]:
    total, unknown = 0, frozenset()
    for eqn in jaxpr.eqns:
        f, u = eqn_flops(eqn)
        total += f
        unknown |= u
    return total, unknown


def eqn_cost(eqn, dtype=None) -> Cost:
    """Cost of one equation as one kernel: its FLOPs, and its inputs read plus outputs written."""
    flops, unknown = eqn_flops(eqn)
    if eqn.primitive.name in FREE:
        return Cost(0, 0, unknown)
    nbytes = sum(aval_bytes(v.aval, dtype) for v in eqn.invars if isinstance(v, Var))
    nbytes += sum(aval_bytes(v.aval, dtype) for v in eqn.outvars)
    return Cost(flops, nbytes, unknown)


@dataclass(frozen=True)
class Kernel:
    """A kernel of the cost model: the ops it runs, FLOPs, bytes, and its time (µs): the roofline
    bound plus launch, or on a measured model (``here``) what it takes inside the program."""

    name: str
    ops: tuple
    flops: int
    bytes: int
    in_shapes: tuple
    out_shapes: tuple
    dtype: str
    time_us: float = 0.0
    bound: str = ""
    unknown: frozenset = frozenset()
    inputs: tuple = field(default=(), compare=False, repr=False)   # the Vars it reads
    outputs: tuple = field(default=(), compare=False, repr=False)  # the Vars it writes
    model: str = "roofline"  # where time_us comes from: "roofline", "measured" or "cached"
    why: str = ""            # on a measured model, why this kernel kept the roofline
    bound_us: float = 0.0    # max(flops / peak, bytes / bandwidth), without launch
    run_us: float | None = None  # measured alone, less its own call's dispatch
    index: tuple = field(default=(), compare=False, repr=False)  # its ops' places in the op view

    @property
    def efficiency(self) -> float | None:
        """Measured time over roofline time (≥ 1 on a well-calibrated roofline): how far this
        backend runs from the hardware's bound; None when not measured."""
        if not self.run_us or not self.bound_us:  # not measured, or within dispatch noise
            return None
        return self.run_us / self.bound_us

    @property
    def primitives(self) -> tuple:
        """Every primitive the kernel runs, in op order."""
        return tuple(p for op in self.ops for p in op.primitives)

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else math.inf


def kernels(closed, fused: bool = False, dtype=None, hw="h100") -> list[Kernel]:
    """Group the op view into kernels: one per op, or (``fused``) the fusion model of ``hw``.

    Named calls whose body is not one kernel under ``hw``'s fusion model are opened first
    (:func:`mlsys_jax.cost.fusion.call_is_one_kernel`), in both modes.
    """
    cost_dtype = parse_dtype(dtype) if isinstance(dtype, str) else dtype
    hardware = get_hardware(hw)
    view = open_calls(closed, lambda e: not call_is_one_kernel(e, hardware.fusion,
                                                               hardware.epilogue))
    ops = [op for op in op_view(view) if not is_free(op)]
    groups = group(ops, hardware.fusion if fused else "none")
    users = consumers(view)
    index = {id(e): i for i, e in enumerate(view.eqns)}
    place = {id(op): i for i, op in enumerate(ops)}  # the same in both groupings of one graph
    return [replace(_kernel(g, cost_dtype, users, index), index=tuple(place[id(op)] for op in g))
            for g in groups]


def _kernel(group: list[Op], cost_dtype, users, index) -> Kernel:
    members = {index[id(e)] for op in group for e in op.eqns}
    defined = {v for op in group for e in op.eqns for v in e.outvars}
    ins = list(dict.fromkeys(v for op in group for v in op.invars if v not in defined))
    # Written: returned, used outside the kernel, or unused (dead values are still written).
    outs = [v for op in group for e in op.eqns for v in e.outvars
            if not users.get(v) or any(u < 0 or u not in members for u in users[v])]
    flops, unknown = 0, frozenset()
    for op in group:
        for e in op.eqns:
            f, u = eqn_flops(e)
            flops, unknown = flops + f, unknown | u
    nbytes = sum(aval_bytes(v.aval, cost_dtype) for v in ins + outs)
    last = group[-1].eqns[-1]
    main = last.outvars[0].aval if last.outvars else None
    dt = getattr(main, "dtype", np.float32)
    if cost_dtype is not None and jnp.issubdtype(dt, jnp.floating):
        dt = cost_dtype
    return Kernel("+".join(op.name for op in group), tuple(group), flops, nbytes,
                  tuple(shape_str(v.aval) for v in ins),
                  tuple(shape_str(v.aval) for v in outs),
                  dtype_name(dt), unknown=unknown, inputs=tuple(ins), outputs=tuple(outs))


@dataclass(frozen=True)
class CostReport:
    """A roofline estimate: kernels with times, totals, peak memory and unknown primitives."""

    hardware: Hardware
    dtype: str | None
    fused: bool
    kernels: list
    unknown: list
    peak_bytes: int = 0
    primitives: dict = field(default_factory=dict)
    overhead_us: float = 0.0  # a measured model's dispatch of the whole program (one jit call)
    uncounted_loops: int = 0  # while loops of unknown trip count (body counted once): FLOPs ≥

    @property
    def total_flops(self) -> int:
        """FLOPs summed over all kernels."""
        return sum(k.flops for k in self.kernels)

    @property
    def total_bytes(self) -> int:
        """Bytes moved to and from memory, summed over all kernels."""
        return sum(k.bytes for k in self.kernels)

    @property
    def time_us(self) -> float:
        """Predicted run time in µs: every kernel plus the whole program's dispatch overhead."""
        return sum(k.time_us for k in self.kernels) + self.overhead_us

    @property
    def measured(self) -> bool:
        """Kernel times come from a measured-operator model (``here``)."""
        return self.hardware.timer is not None

    def totals(self) -> dict:
        """The report's headline figures as one dict (FLOPs, bytes, kernels, µs, peak bytes)."""
        return {"flops": self.total_flops, "bytes": self.total_bytes,
                "kernels": len(self.kernels), "time_us": self.time_us,
                "peak_bytes": self.peak_bytes}

    def rows(self) -> list[dict]:
        """One row per kernel, for tables and ``inspect --json``."""
        return [{"name": k.name, "primitives": list(k.primitives), "in": ", ".join(k.in_shapes),
                 "out": ", ".join(k.out_shapes), "flops": k.flops, "bytes": k.bytes,
                 "intensity": k.intensity, "bound": k.bound, "time_us": k.time_us,
                 **({"model": k.model, "why": k.why, "run_us": k.run_us,
                     "bound_us": k.bound_us, "x_roofline": k.efficiency}
                    if self.measured else {})}
                for k in self.kernels]


def roofline(k: Kernel, hw: Hardware) -> Kernel:
    """Fill a kernel's time: ``max(flops / peak, bytes / bandwidth) + launch`` (µs)."""
    compute = k.flops / hw.peak(k.dtype)
    memory = k.bytes / hw.bandwidth
    bound = "compute" if compute > memory else "memory"
    t = (max(compute, memory) + hw.launch_s) * 1e6
    return replace(k, time_us=t, bound=bound, bound_us=max(compute, memory) * 1e6)


def estimate(closed, hw="h100", dtype=None, fused: bool | None = None,
             strict: bool = False) -> CostReport:
    """Roofline estimate of a jaxpr: ``estimate(trace(f, x), hw='h100', dtype='bf16')``.

    >>> from mlsys_jax import cost, ir
    >>> matmul = ir.trace(lambda a, b: a @ b, "f32[256,256]", "f32[256,256]")
    >>> report = cost.estimate(matmul, hw="h100", dtype="bf16")
    >>> report.total_flops, report.total_bytes, len(report.kernels)
    (33554432, 393216, 1)

    Args:
      hw: a Hardware or its name ('h100', 'h200', 'a100', 'cpu', or 'here': every kernel
        compiled and timed alone on this backend, cached — :mod:`mlsys_jax.cost.here.operators`).
      dtype: cost every floating tensor as this dtype (the lecture costs BF16); None keeps dtypes.
      fused: group kernels with the hardware's fusion model; None: the hardware's default (one
        kernel per op on the lecture's GPU models, XLA:CPU's loop fusion on ``cpu``).
      strict: raise MlsysError if a primitive has no cost rule (otherwise it is listed in
        ``unknown`` and contributes no FLOPs).
    """
    from mlsys_jax.cost.liveness import liveness
    from mlsys_jax.ir.walk import primitive_counts

    hardware = get_hardware(hw)
    fused = hardware.fused_default if fused is None else fused
    if hardware.timer is not None and dtype is not None:
        raise MlsysError(f"--dtype {dtype}: the '{hardware.name}' model times the graph in its "
                         "own dtypes; drop --dtype (or cost on a roofline model: --hw cpu)")
    ks = kernels(closed, fused=fused, dtype=dtype, hw=hardware)
    unknown = sorted(set().union(*(k.unknown for k in ks))) if ks else []
    if strict and unknown:
        raise MlsysError(f"no cost rule for primitive(s) {', '.join(unknown)}; add a rule in "
                         "mlsys_jax/cost/flop_rules.py or run without strict")
    overhead = 0.0
    if hardware.timer is not None:
        ks, overhead = hardware.timer.fill(closed, ks, fused, hardware)
    else:
        ks = [roofline(k, hardware) for k in ks]
    peak = liveness(closed, dtype=dtype).peak_bytes
    return CostReport(hardware, dtype if dtype is None else str(dtype), fused, ks, unknown, peak,
                      dict(primitive_counts(closed)), overhead, uncounted_whiles(closed))
