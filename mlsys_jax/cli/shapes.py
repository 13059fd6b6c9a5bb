"""What the commands say when they work on shapes, and XLA's figures beside our estimate.

A factory that returns ``ShapeDtypeStruct`` leaves (or any factory under ``--abstract``) builds
nothing: the commands then trace and compile, never run. Each says so in its first line, refuses
what needs values (``--measure``, ``--hw here``, exactness) in one line, and prints XLA's own
figures of the compiled function beside ours, with the reason where the two disagree.
"""
from __future__ import annotations

from mlsys_jax.errors import UsageError

NOTICE = ("on shapes only: the factory's arrays are ShapeDtypeStructs; nothing of the model is "
          "allocated, and nothing runs: figures come from tracing and XLA's compile")
# Our FLOPs and XLA's (scan bodies per trip on both sides) agree to rounding on the models we
# test; a larger gap is a counting difference worth a line.
DISAGREE = 0.10


def notice() -> str:
    """:data:`NOTICE`, wrapped to the terminal's width (the first line of a command's text)."""
    from mlsys_jax.tables import wrap

    return wrap(NOTICE, first="")


def refuse_values(flag: str, why: str, fix: str = "run without it") -> None:
    """One line, exit 2: ``flag`` needs values, and on shapes there are none."""
    raise UsageError(f"{flag} needs the model's values and the factory returns shapes only "
                     f"({why}); {fix}, or use a factory that builds arrays at a size that fits")


def xla_line(xla) -> str:
    """XLA's figures of the compiled function, per device where the program is SPMD."""
    return (f"XLA: {xla.xla_flops / 1e9:.4g} GFLOP (scan bodies per trip), "
            f"{xla.xla_bytes_accessed / 1e6:.4g} MB accessed (loop bodies once); compiled here, "
            f"per device: arguments {xla.xla_argument_bytes / 1e6:.4g} MB, outputs "
            f"{xla.xla_output_bytes / 1e6:.4g} MB, temp {xla.xla_temp_bytes / 1e6:.4g} MB "
            f"(XLA:CPU's), aliased {xla.xla_alias_bytes / 1e6:.4g} MB")


def beside_table(both, report, xla, width: int | None = None) -> str:
    """The totals, ours (both estimates) beside XLA's own (``cost_analysis``'s FLOPs and bytes
    accessed, ``memory_analysis``'s bytes of the compiled program), with what each column
    means; ``xla`` None: ours alone."""
    from mlsys_jax.tables import format_table, wrap

    peak = report.peak_bytes
    ours = [("ours, unfused", both.unfused), ("ours, fused", both.fused)]
    values = [(label, r.total_flops, r.total_bytes, peak, None, None, None) for label, r in ours]
    if xla:
        total = (xla.xla_argument_bytes + xla.xla_output_bytes + xla.xla_temp_bytes
                 - xla.xla_alias_bytes)
        values.append(("XLA", xla.xla_flops, xla.xla_bytes_accessed, total,
                       xla.xla_argument_bytes, xla.xla_output_bytes, xla.xla_temp_bytes))
    flop_scale, flop_unit = _scale([v[1] for v in values], "FLOP")
    byte_scale, byte_unit = _scale([x for v in values for x in v[2:] if x is not None], "B")
    columns = [flop_unit] + [f"{byte_unit} {n}" for n in ("moved", "peak", "args", "out",
                                                             "temp")]
    scales = [flop_scale] + [byte_scale] * 5
    rows = [{"totals": label, **{c: "" if x is None else _figure(x / scale)
                                 for c, x, scale in zip(columns[:6 if xla else 3], figures,
                                                        scales)}}
            for label, *figures in values]
    note = ("moved: ours, every kernel's inputs and outputs; XLA's bytes accessed. peak: ours, "
            "the most bytes live at once"
            + ("; XLA's args + out + temp - aliased, compiled here (temp: XLA:CPU's)"
               if xla else ""))
    return format_table(rows, width=width) + "\n" + wrap(note, width=width)


def _scale(xs: list, name: str) -> tuple[float, str]:
    top = max(xs, default=0)
    for size, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if top >= size:
            return size, prefix + name
    return 1.0, name


def _figure(x: float) -> str:
    return "0" if x == 0 else f"{x:.4g}"


def why_line(ours_flops: float, xla, summary, closed) -> str | None:
    """Where our FLOPs and XLA's differ by more than :data:`DISAGREE`: the gap, what we know
    counts differently in this graph, and the modules that hold the most FLOPs."""
    if not xla.xla_flops or abs(ours_flops - xla.xla_flops) <= DISAGREE * xla.xla_flops:
        return None
    from mlsys_jax.ir import primitive_counts

    counts = primitive_counts(closed)
    known = []
    if counts.get("while"):
        known.append(f"{counts['while']} while loop(s): a trip count is unknown to both sides, "
                     "which count each body once")
    if counts.get("custom_call") or counts.get("pure_callback"):
        known.append("callbacks: XLA cannot see their work")
    leaves = sorted(summary.leaves(), key=lambda row: -row.cost.flops)[:3] if summary else []
    where = ", ".join("/".join(row.cost.path) or "(top)" for row in leaves)
    gap = (ours_flops - xla.xla_flops) / xla.xla_flops
    return (f"why this number: our FLOPs are {gap:+.0%} of XLA's"
            + (f"; {'; '.join(known)}" if known else "")
            + (f"; most FLOPs sit in {where}" if where else ""))


def render_shard(name: str, out: dict) -> str:
    """``shard``'s text on shapes: what the largest device holds, and the collectives per step."""
    from mlsys_jax.runtime import format_bytes
    from mlsys_jax.tables import format_table, wrap

    d = out["per_device"]
    mesh = " × ".join(f"{k} {v}" for k, v in out["mesh"].items())
    rows = [{"what": what, "bytes": format_bytes(d[key]), "source": source} for what, key, source in (
        ("parameters", "param_bytes", "layout"), ("gradients", "grad_bytes", "layout"),
        ("optimizer state", "optimizer_bytes", "layout"),
        ("arguments", "xla_argument_bytes", "XLA"), ("outputs", "xla_output_bytes", "XLA"),
        ("temp", "xla_temp_bytes", "XLA:CPU"), ("aliased (donated)", "xla_alias_bytes", "XLA"),
        ("total", "total_bytes", "arguments + outputs - aliased + temp"))]
    lines = [format_table(rows, title=f"\n[{name} on {mesh}, ZeRO-{out['zero']}: the largest "
                                      f"device, compiled in {out['compile_s']:.1f} s]")]
    colls = [{"kind": r["kind"], "axis": r["axis"], "count": r["count"],
              "bytes sent": format_bytes(r["bytes"]),
              "formula": format_bytes(r["formula_bytes"]) if r["formula_bytes"] else "-",
              "what": r["what"]} for r in out["collectives"] if r["count"] or r["formula_bytes"]]
    if colls:
        lines.append(format_table(colls, title="\n[collectives per step, per device (ring "
                                               "bytes; a loop's counted once per trip)]"))
    notice = out.get("tensor_parallel", {}).get("notice")
    lines += [wrap(note, first="") for note in ([notice] if notice else []) + out["notes"]]
    return "\n".join(lines)
