"""XLA's own figures for a traced function, to print beside ours: the compiled program's
``cost_analysis()`` and ``memory_analysis()``, and FLOPs with scan bodies counted per trip.

XLA's cost analysis counts a ``while`` body once, whatever its trip count (measured on XLA:CPU,
JAX 0.10.2: a scan of 8 matmuls reports one matmul's FLOPs), while our model counts a scan's
body ``length`` times. So that the two compare like with like, :func:`xla_flops_per_trip` adds,
for every scan, XLA's figure for its body times ``length - 1``, each body lowered alone (HLO cost
analysis on the lowered module: no compile). A ``while_loop``'s trip count is unknown to both
sides, which count its body once. Memory figures are per device for an SPMD program, and
XLA:CPU's temp bytes are CPU-compiled figures (another backend fuses and schedules otherwise).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import jax

from mlsys_jax.compat import ClosedJaxpr, jaxpr_as_fun
from mlsys_jax.ir.walk import bodies


@dataclass(frozen=True)
class XlaFigures:
    """XLA's figures for one compiled program, named as ``--json`` prints them."""

    xla_flops: float              # scan bodies counted per trip (see the module docstring)
    xla_bytes_accessed: float     # as cost_analysis() reports it: while bodies counted once
    xla_argument_bytes: int
    xla_output_bytes: int
    xla_temp_bytes: int           # XLA:CPU's temp, from CPU fusion and scheduling
    xla_alias_bytes: int

    def as_dict(self) -> dict:
        """The figures as plain data, for tables and JSON."""
        return asdict(self)


def _abstract_args(jaxpr) -> list:
    return [v.aval for v in jaxpr.invars]


def _lowered(closed: ClosedJaxpr):
    return jax.jit(jaxpr_as_fun(closed)).lower(*_abstract_args(closed.jaxpr))


def _analysis(lowered_or_compiled) -> dict:
    """``cost_analysis()`` as one dict (older JAX: a list of one dict per program)."""
    analysis = lowered_or_compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    return analysis or {}


def _flops(lowered_or_compiled) -> float:
    return float(_analysis(lowered_or_compiled).get("flops", 0.0))


def _scans(jaxpr):
    """The scan equations of ``jaxpr`` that no other scan encloses (found through calls)."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            yield eqn
        else:
            for body in bodies(eqn):
                yield from _scans(body.jaxpr)


def _per_trip_extra(jaxpr) -> float:
    """FLOPs XLA leaves out of ``jaxpr`` by counting each scan body once."""
    extra = 0.0
    for eqn in _scans(jaxpr):
        body, n = eqn.params["jaxpr"], int(eqn.params["length"])
        once = _flops(_lowered(body))
        extra += (n - 1) * once + n * _per_trip_extra(body.jaxpr)
    return extra


def xla_flops_per_trip(closed: ClosedJaxpr, flops_once: float) -> float:
    """XLA's FLOPs for ``closed`` (``flops_once``, its cost analysis) with scans per trip."""
    return flops_once + _per_trip_extra(closed.jaxpr)


def compile_on_shapes(closed: ClosedJaxpr):
    """``closed`` compiled with ``jax.jit`` on its avals (nothing allocated): the program
    :func:`xla_figures` reads, and that ``inspect --hw cpu`` may also call once as a probe."""
    return _lowered(closed).compile()


def xla_figures(closed: ClosedJaxpr, compiled=None) -> XlaFigures:
    """Compile ``closed`` on its avals (or take ``compiled``, the same program compiled with its
    shardings) and read XLA's figures. Nothing of the arguments' size is allocated."""
    compiled = compiled if compiled is not None else _lowered(closed).compile()
    analysis = _analysis(compiled)
    memory = compiled.memory_analysis()
    return XlaFigures(
        xla_flops=xla_flops_per_trip(closed, float(analysis.get("flops", 0.0))),
        xla_bytes_accessed=float(analysis.get("bytes accessed", 0.0)),
        xla_argument_bytes=int(memory.argument_size_in_bytes),
        xla_output_bytes=int(memory.output_size_in_bytes),
        xla_temp_bytes=int(memory.temp_size_in_bytes),
        xla_alias_bytes=int(memory.alias_size_in_bytes))


def fused_contractions(compiled) -> list[int]:
    """The contractions (convolutions, dots) of each kernel of the compiled program that runs
    more than one (a YNNPACK graph fusion may take a chain of convolutions with their
    elementwise work and a final reduction, where our fusion model keeps each one a kernel of
    its own): their counts, largest first; empty when XLA keeps them apart."""
    import re

    counts, name = {}, None
    calls = []
    for line in compiled.as_text().splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            counts[name] = 0
        elif name is not None and re.search(r"= [^=]*\b(convolution|dot)\(", line):
            counts[name] += 1
        if " fusion(" in line:
            calls += re.findall(r"calls=%([\w.\-]+)", line)
    return sorted((counts.get(c, 0) for c in calls if counts.get(c, 0) > 1), reverse=True)
