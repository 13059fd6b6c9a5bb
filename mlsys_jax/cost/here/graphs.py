"""Kernels XLA runs as one: a YNNPACK graph fusion may take a chain of convolutions (or dots),
their elementwise work and pooling, where the fusion model keeps each contraction a kernel of its
own. Such a graph does not run as its kernels do alone: on XLA:CPU a graph may spread over the
cores when they are free, where each convolution alone runs on one core whatever the load
(docs/costs.md has the measurements). So the run of the model's kernels from the graph's first
contraction up to the next contraction after its last is compiled and timed as one program too
(XLA makes the same graph of it, and it tracks the whole program on a busy and on an idle
machine), and its time replaces theirs.

The graphs are read from the whole program as XLA compiled it (``inspect`` compiles it anyway,
for XLA's figures): each fusion that runs more than one contraction, matched to the run of the
model's contraction kernels with the same output types (in any order: XLA may schedule a
shortcut's convolution elsewhere in the graph). No compiled program, or no match: no span.
"""
from __future__ import annotations

import re
from collections import Counter
from types import SimpleNamespace

from mlsys_jax.cost.here.programs import kernel_program

CONTRACTIONS = ("conv_general_dilated", "dot_general")
_HEAD = re.compile(r"^(?:ENTRY )?%([\w.\-]+) .*\{$")
_CONTRACTION = re.compile(r"= (\w+)\[([\d,]*)\]\S* (?:convolution|dot)\(")


def fused_graphs(hlo_text: str) -> list[list[str]]:
    """The output types (``f32[8,32,32,32]``) of the contractions of each fusion of the compiled
    program that runs more than one, in fusion-call order."""
    found, name, calls = {}, None, []
    for line in hlo_text.splitlines():
        head = _HEAD.match(line)
        if head:
            name = head.group(1)
            found[name] = []
        elif name is not None and (m := _CONTRACTION.search(line)):
            found[name].append(f"{m.group(1)}[{m.group(2)}]")
        if " fusion(" in line:
            calls += re.findall(r"calls=%([\w.\-]+)", line)
    return [found[c] for c in dict.fromkeys(calls) if len(found.get(c, ())) > 1]


def _contractions(kernel) -> list[str]:
    return [e.outvars[0].aval.str_short(short_dtypes=True) for op in kernel.ops for e in op.eqns
            if e.primitive.name in CONTRACTIONS]


def spans(hlo_text: str, kernels: list) -> list[range]:
    """The runs of ``kernels`` (indices) that XLA compiles as one graph: each from the first
    contraction of the first unused run whose contractions match a graph's up to the next
    contraction (a graph takes the elementwise work, pooling and reductions after its last: XLA
    does not draw the graph of a run cut at its last contraction)."""
    marks = [(i, t) for i, k in enumerate(kernels) for t in _contractions(k)]
    out, used = [], set()
    for graph in fused_graphs(hlo_text):
        want, n = Counter(graph), len(graph)
        for s in range(len(marks) - n + 1):
            window = marks[s:s + n]
            if used.isdisjoint(range(s, s + n)) and Counter(t for _, t in window) == want:
                used.update(range(s, s + n))
                stop = marks[s + n][0] if s + n < len(marks) else len(kernels)
                out.append(range(window[0][0], stop))
                break
    return [r for r in out if len(r) > 1]


def span_program(kernels: list, span: range, consts: dict, returned: set):
    """The program of ``kernels[span]`` as one kernel: the inputs none of them writes, the
    outputs read after the span, returned (``returned``) or read by none of them —
    :func:`programs.kernel_program`."""
    members = [kernels[i] for i in span]
    written = {v for k in members for v in k.outputs}
    read = {v for k in members for v in k.inputs}
    later = {v for k in kernels[span.stop:] for v in k.inputs}
    ins = tuple(dict.fromkeys(v for k in members for v in k.inputs if v not in written))
    outs = tuple(v for k in members for v in k.outputs
                 if v in later or v in returned or v not in read)
    name = f"XLA graph of {len(members)} kernels ({members[0].name} … {members[-1].name})"
    group = SimpleNamespace(ops=tuple(op for k in members for op in k.ops), inputs=ins,
                            outputs=outs, name=name,
                            in_shapes=tuple(v.aval.str_short() for v in ins),
                            out_shapes=tuple(v.aval.str_short() for v in outs))
    return kernel_program(group, consts)
