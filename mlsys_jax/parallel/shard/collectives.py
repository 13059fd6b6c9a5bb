"""The collectives of a user's sharded step, by mesh axis, beside formulas for what it must send.

Each collective of the compiled HLO (``comm.collectives``) is assigned the mesh axes its device
groups span. Per (kind, axis) we sum the ring bytes one device sends (§5, ``comm.ring_bytes``) of
the array payload; scalars packed into the same collectives (the loss, global-norm partial sums)
are listed apart. The formulas say what the layout requires:

* ``data``: every gradient all-reduced (its TP share, Ψ_d bytes per device); with ZeRO the
  parameters it splits are all-gathered once per step (stages 1-2: after the update; stage 3:
  for the forward, kept for the backward). XLA:CPU all-reduces gradients that ZeRO-2/3 keep
  split and slices them (its pipeline has no reduce-scatter creator, unlike XLA:GPU's), so the
  gradient traffic is an all-reduce at every stage.
* ``model`` (Megatron, §5.2): a matmul that contracts a split dimension leaves partial sums, so
  its output is all-reduced in the forward (attention output, MLP down projection); a matmul
  that splits its output features gets its input's cotangent as partial sums, all-reduced in
  the backward (one per query/key/value projection when they are separate matmuls, as in flax).
"""
from __future__ import annotations

import math
from collections import defaultdict

import jax
import numpy as np

from mlsys_jax.compat import Literal, dce_jaxpr_consts
from mlsys_jax.ir import bodies, walk
from mlsys_jax.ir.primitives import TRANSPARENT_CALLS
from mlsys_jax.parallel import comm
from mlsys_jax.parallel.axes import MODEL
from mlsys_jax.parallel.shard.layout import Layout, shard_bytes
from mlsys_jax.parallel.shard.partition_rules import array_paths

_PASS_THROUGH = ("convert_element_type", "copy", "copy_p", "pvary")


def axes_of(coll: comm.Collective, mesh) -> tuple[str, ...]:
    """Mesh axes along which a collective's device groups extend (all axes if it names none)."""
    if not coll.groups:
        return tuple(mesh.axis_names)
    coords = np.array(np.unravel_index(list(coll.groups[0]), mesh.devices.shape))
    return tuple(a for a, row in zip(mesh.axis_names, coords) if len(set(row.tolist())) > 1)


def by_axis(hlo: str, mesh) -> dict:
    """``{(kind, axis): {count, payload_bytes, scalar_bytes, ring_bytes}}`` of compiled HLO, per
    step: a collective inside a loop (a scan over layers) counts once per trip."""
    out: dict = defaultdict(lambda: {"count": 0, "payload_bytes": 0, "scalar_bytes": 0,
                                     "ring_bytes": 0.0})
    for c in comm.collectives(hlo, mesh.devices.size):
        row = out[(c.kind, ",".join(axes_of(c, mesh)) or "-")]
        payload = c.result_bytes - c.scalar_bytes
        row["count"] += c.trips
        row["payload_bytes"] += c.trips * payload
        row["scalar_bytes"] += c.trips * c.scalar_bytes
        row["ring_bytes"] += c.trips * comm.ring_bytes(c.kind, payload, c.group_size)
    return dict(out)


def unused_leaves(loss, trainable, batch) -> tuple[str, ...]:
    """Paths of parameters the loss does not depend on (dead code in its jaxpr), e.g. BatchNorm's
    running statistics when the loss drops the updated ones: their gradient is a constant zero,
    and XLA sends nothing for them."""
    closed = jax.make_jaxpr(loss)(trainable, batch)
    _, _, used = dce_jaxpr_consts(closed.jaxpr, [True] * len(closed.jaxpr.outvars))
    return tuple(p for (p, _), u in zip(array_paths(trainable), used) if not u)


def data_formula(layout: Layout, trainable, unused: tuple = ()) -> dict:
    """``{(kind, 'data'): (ring bytes, what)}``: gradient all-reduce and ZeRO's all-gather."""
    n = layout.data_size
    if n <= 1:
        return {}
    size = {p: shard_bytes(x, s) for (p, x), s in zip(array_paths(trainable),
                                                      jax.tree.leaves(layout.compute))}
    psi = sum(b for p, b in size.items() if p not in unused)
    out = {("all-reduce", layout.data_axis): (
        comm.ring_bytes("all-reduce", psi, n), f"gradients, {psi:,} B per device (TP share)")}
    # stage 3 gathers what the forward uses; stages 1-2 gather the updated parameters, computed
    # on the shards of the optimizer state (a stateless optimizer, plain SGD, updates in place)
    sharded_state = any(not s.is_fully_replicated for s in jax.tree.leaves(layout.opt_state))
    splits = layout.splits
    if splits.params or (splits.optimizer and sharded_state):
        gathered = sum(b for p, b in size.items() if p not in layout.unsplit
                       and (not splits.params or p not in unused))
        when = "for the forward" if splits.params else "after the update"
        out[("all-gather", layout.data_axis)] = (
            comm.ring_bytes("all-gather", gathered, n),
            f"ZeRO-split parameters gathered {when}, {gathered:,} B")
    return out


def formulas(loss, trainable, batch, layout: Layout, synced: tuple | None = None) -> dict:
    """Every formula of this layout: :func:`data_formula` and :func:`tp_formula` (with the
    forward count under ``'forward_all_reduces'``), the parameters the loss ignores, and with
    ``synced = (closed, name)`` — the loss traced per shard with its axis name bound — the
    model's own collectives over that name (:func:`synced_bytes`)."""
    unused = unused_leaves(loss, trainable, batch)
    out = {**data_formula(layout, trainable, unused),
           **tp_formula(loss, trainable, batch, layout), "unused": unused}
    key = ("all-reduce", layout.data_axis)
    if synced is not None and key in out:
        stats = synced_bytes(*synced)
        ring, what = out[key]
        out[key] = (ring + 2 * comm.ring_bytes("all-reduce", stats, layout.data_size),
                    f"{what}; + the model's synchronised statistics, {stats:,} B forward and "
                    "their cotangents backward")
    return out


def synced_bytes(closed, name: str) -> int:
    """Bytes the loss's collectives over axis ``name`` sum (a synchronised BatchNorm's means),
    in its forward pass; the backward pass sums their cotangents, as many bytes again."""
    total = 0
    for _, eqn in walk(closed):
        if eqn.primitive.name in ("psum", "pmax", "pmin") and name in eqn.params["axes"]:
            total += sum(_aval_bytes(v) for v in eqn.invars if not isinstance(v, Literal))
    return total


def tp_formula(loss, trainable, batch, layout: Layout, axis: str = MODEL) -> dict:
    """``{('all-reduce', axis): (ring bytes, what)}`` from the matmuls that use split parameters.

    Also returns the number of forward all-reduces Megatron's layout needs under key
    ``'forward_all_reduces'``. The analysis follows split parameters into matmuls directly,
    through dtype casts, function calls and scans over stacked layers (a body's matmuls once per
    trip); a matmul reached another way (after a reshape) is not counted, and the
    measured/formula ratio then shows it.
    """
    m = int(layout.mesh.shape[axis]) if axis in layout.mesh.axis_names else 1
    if m <= 1:
        return {}
    closed = jax.make_jaxpr(loss)(trainable, batch)
    n_params = len(jax.tree.leaves(trainable))
    split = {}
    for v, (path, _) in zip(closed.jaxpr.invars[:n_params], array_paths(trainable)):
        dims = {d for d, e in enumerate(layout.tp.get(path, ())) if e == axis
                or (isinstance(e, tuple) and axis in e)}
        if dims:
            split[v] = dims
    found = {"forward": [], "backward": []}
    _follow(closed.jaxpr, split, set(closed.jaxpr.invars[:n_params]), found)
    n = layout.data_size
    fwd = sum(comm.ring_bytes("all-reduce", b / n, m) for b in found["forward"])
    bwd = sum(comm.ring_bytes("all-reduce", b / n, m) for b in found["backward"])
    return {("all-reduce", axis): (fwd + bwd, (
        f"activations: {len(found['forward'])} forward (outputs of matmuls contracting a split "
        f"dimension) + {len(found['backward'])} backward (input cotangents of matmuls splitting "
        f"their outputs)")), "forward_all_reduces": len(found["forward"])}


def _aval_bytes(v) -> int:
    return int(v.aval.dtype.itemsize * math.prod(v.aval.shape))


def _follow(jaxpr, split: dict, depends: set, found: dict) -> None:
    """Walk ``jaxpr``: track split-parameter vars and vars that depend on parameters."""
    for eqn in jaxpr.eqns:
        ins = [v for v in eqn.invars if not isinstance(v, Literal)]
        if any(v in depends for v in ins):
            depends.update(eqn.outvars)
        hit = [(i, v) for i, v in enumerate(eqn.invars) if not isinstance(v, Literal)
               and v in split]
        if not hit:
            continue
        name = eqn.primitive.name
        if name in _PASS_THROUGH:
            split[eqn.outvars[0]] = split[hit[0][1]]
        elif name == "dot_general":
            contract, _ = eqn.params["dimension_numbers"]  # ((lhs dims, rhs dims), batch)
            for i, v in hit:
                if split[v] & set(contract[i]):
                    found["forward"].append(_aval_bytes(eqn.outvars[0]))
                elif eqn.invars[1 - i] in depends:
                    found["backward"].append(_aval_bytes(eqn.invars[1 - i]))
        elif name in TRANSPARENT_CALLS and bodies(eqn):  # the body runs on the call's inputs
            sub = bodies(eqn)[0].jaxpr
            inner = {sv: split[ov] for ov, sv in zip(eqn.invars, sub.invars)
                     if not isinstance(ov, Literal) and ov in split}
            inner_dep = {sv for ov, sv in zip(eqn.invars, sub.invars)
                         if not isinstance(ov, Literal) and ov in depends}
            _follow(sub, inner, inner_dep, found)
        elif name == "scan":                 # a layer stack: one trip's body, counted per trip
            _follow_scan(eqn, split, depends, found)


def _follow_scan(eqn, split: dict, depends: set, found: dict) -> None:
    """A scan's body on one trip's slices: a split parameter among its ``xs`` is split along
    its dims less the leading one; what the body's matmuls need counts once per trip."""
    body, fixed = eqn.params["jaxpr"].jaxpr, eqn.params["num_consts"] + eqn.params["num_carry"]
    inner, inner_dep = {}, set()
    for k, (ov, sv) in enumerate(zip(eqn.invars, body.invars)):
        if isinstance(ov, Literal):
            continue
        if ov in depends:
            inner_dep.add(sv)
        if ov in split:
            dims = split[ov] if k < fixed else {d - 1 for d in split[ov] if d > 0}
            if dims:
                inner[sv] = dims
    trip = {"forward": [], "backward": []}
    _follow(body, inner, inner_dep, trip)
    for key, sizes in trip.items():
        found[key] += sizes * int(eqn.params["length"])


def table(layout: Layout, hlo: str, formulas: dict) -> list[dict]:
    """One row per (kind, axis): measured count and ring bytes beside the formula's bytes."""
    measured = by_axis(hlo, layout.mesh)
    formulas = {k: v for k, v in formulas.items() if isinstance(k, tuple)}
    rows = []
    for key in sorted(set(measured) | set(formulas)):
        got = measured.get(key, {"count": 0, "payload_bytes": 0, "scalar_bytes": 0,
                                 "ring_bytes": 0.0})
        want, what = formulas.get(key, (0.0, "scalars only (the loss, norms)"
                                         if not got["payload_bytes"] else
                                         "not in the formula: XLA's own choice"))
        rows.append({"kind": key[0], "axis": key[1], "count": got["count"],
                     "bytes": got["ring_bytes"], "formula_bytes": want,
                     "ratio": got["ring_bytes"] / want if want else None,
                     "result_bytes": got["payload_bytes"], "scalar_bytes": got["scalar_bytes"],
                     "what": what})
    return rows


def forward_all_reduces(loss, trainable, batch, layout: Layout, megatron: int | None,
                        options: dict | None = None, axis: str = MODEL) -> tuple[dict, dict]:
    """All-reduces over ``axis`` in the compiled forward pass alone, beside Megatron's count, and
    where they come from (the JAX operation in the HLO metadata: ``Dense_1/dot_general`` for a
    row-parallel matmul, a gather or reduction for a vocabulary split across the model axis)."""
    fwd = jax.jit(loss, in_shardings=(layout.compute, layout.batch)).lower(
        trainable, batch).compile(options)
    hlo = fwd.as_text()
    got = by_axis(hlo, layout.mesh).get(("all-reduce", axis), {"count": 0})
    sources: dict = {}
    for c in comm.collectives(hlo, layout.mesh.devices.size):
        if c.kind == "all-reduce" and axis in axes_of(c, layout.mesh):
            name = "/".join(p for p in c.op_name.split("/")[1:] if p) or "?"
            sources[name] = sources.get(name, 0) + 1
    return {"measured": got["count"], "megatron": megatron}, sources
