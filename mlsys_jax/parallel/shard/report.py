"""The figures of one ``mlsys-jax shard`` run and its verdict, as data (:class:`ShardReport`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mlsys_jax.parallel.shard.compare import FLOOR_EPS
from mlsys_jax.parallel.shard.inputs import display_path
from mlsys_jax.parallel.shard.run import QUANTITIES
from mlsys_jax.parallel.shard.semantics import arrangement_how

# Equivalent one-device computations that differ by more than this fraction of a quantity's
# largest magnitude cannot vouch for much: the report says so.
THIN_EVIDENCE = 1e-2


@dataclass
class ShardReport:
    """Every figure of ``mlsys-jax shard``: the JSON object is :meth:`to_json`."""

    mesh: dict
    zero: int
    steps: int
    exact: bool
    reason: str
    max_abs_diff: dict        # free-running, after `steps` steps, against one device
    teacher_forced: dict      # per step from one device's state: what decides `exact`
    bound: dict               # the bound at the leaf nearest (or furthest past) its own bound
    bound_ratio: dict         # that leaf's |Δ| / bound: the verdict's rule is every one <= 1
    magnitude: dict           # max |q| of the one-device reference
    noise: dict               # max |reference - its equivalent one-device computation|
    per_device_bytes: dict
    collectives: list
    step_time_ratio: float | None
    semantics: str = "global"
    equal_on_this_batch: bool = True
    separability: dict = field(default_factory=dict)
    axis_name: str | None = None
    tensor_parallel: dict = field(default_factory=dict)
    forward_all_reduces: dict = field(default_factory=dict)
    forward_all_reduce_sources: dict = field(default_factory=dict)   # JAX operation -> count
    rules: list = field(default_factory=list)
    rules_derived: bool = False
    replicated_no_rule: list = field(default_factory=list)
    zero_unsplit: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    per_device: dict = field(default_factory=dict)   # layout.per_device: the keys shapes print
    abstract: bool = False                            # a run on arrays (shapes.py: on shapes)
    sharded: dict | None = field(default=None, repr=False)  # {"free": {"params": host tree}}

    def to_json(self) -> dict:
        out = asdict(self)
        out.pop("sharded")
        return out


def _figure(j) -> str:
    """The leaf nearest its bound (a leaf's bound grows with its own noise, so the largest |Δ|
    may sit at another leaf, within a larger bound)."""
    rms = "rms " if j.rule == "rms" else ""
    return (f"{rms}|Δ| {j.at_worst:.3g} ≤ bound {j.bound:.3g} at the leaf nearest its bound, "
            f"largest |Δ| {j.diff:.3g}, noise up to {j.noise:.3g}")


def precision(forced: dict, how: str) -> str:
    """Which quantities compute in a dtype less precise than float32, and the bound that follows
    (``compare.Judgement``'s rule for them); empty when none does. ``how``: the equivalent
    computation that measures their rounding besides the twin (``semantics.arrangement_how``)."""
    narrow = [q for q in QUANTITIES if forced[q].narrow]
    if not narrow:
        return ""
    dtype = "/".join(sorted(set().union(*(forced[q].narrow for q in narrow))))
    which = " and ".join({"grads": "gradients"}.get(q, q) for q in narrow)
    reductions = max(forced[q].reductions for q in narrow)
    measured = f"of the twin, and of {how}" if how else "of the twin"
    return (f"the {which} compute in {dtype}, so their bound is {dtype}'s: 2 × the measured "
            f"noise ({measured}) plus {reductions} {dtype} ulp(s) at a leaf's largest magnitude "
            f"(one per device's partial result, where the leaf holds {dtype} numbers), for the "
            f"max and for the rms over each leaf")


def verdict(setup, sep, sem, forced: dict) -> tuple[bool, bool, str]:
    """``(exact, equal on this batch, reason)``."""
    ok = all(forced[q].within for q in QUANTITIES)
    worst = max(QUANTITIES, key=lambda q: forced[q].ratio)
    w = forced[worst]
    rms = "rms " if w.rule == "rms" else ""
    narrow = precision(forced, arrangement_how(setup, sem))
    rule = (f"the {w.dtype} bound below" if w.dtype else
            f"2 × the noise of an equivalent one-device computation there, plus {FLOOR_EPS} eps "
            "of the largest magnitude")
    off = (f"{rms}|Δ{worst}| {w.at_worst:.3g} > bound {w.bound:.3g} at one leaf ({rule}; noise "
           f"up to {w.noise:.3g}) at the same state" + (f"; {narrow}" if narrow else ""))
    matched = ("the mesh computes exactly that, step by step (teacher-forced, within the noise "
               "of an equivalent one-device computation)")
    if sep is not None and not sep.separable:
        g = sep.grads
        numbers = (f"whole-batch loss {sep.whole:.6g}, mean of the shards' losses "
                   f"{sep.shards_mean:.6g}; gradients differ by {g.diff:.3g}, noise {g.noise:.3g}")
        same = matched if ok else f"and the mesh does not even compute that: {off}"
        if sep.equal_here:
            return False, True, (f"not separable in general: {'; '.join(sep.causes)}; equal on "
                                 f"this batch ({numbers}): {sep.why_equal}; the mesh runs data "
                                 f"parallelism's per-shard losses: {same}")
        return False, False, (f"not separable over the batch ({numbers}): "
                              f"{'; '.join(sep.causes)}; {same}")
    if not ok:
        return False, True, f"the sharded step differs from one device beyond rounding: {off}"
    grads = _figure(forced["grads"])
    if sem.kind == "synchronised":
        return True, True, (f"the model's statistics are synchronised over the data axis (its "
                            f"axis {setup.axis_name!r} bound to data): loss, gradients and "
                            f"optimizer update equal one device's whole-batch step within the "
                            f"noise of an equivalent one-device computation (gradients {grads}), "
                            "step by step")
    where = (f"at {sep.points} points" if sep is not None and sep.points > 1 else
             "at the given parameters on the example batch")
    how = ("one data shard" if sep is None else
           f"separable loss (no equation mixes examples but the final mean; whole-batch and "
           f"per-shard gradients agree {where})")
    return True, True, (f"{how}; loss, gradients and optimizer update equal one device's within "
                        f"the noise of an equivalent one-device computation (gradients {grads}), "
                        "step by step" + (f"; {narrow}" if narrow else ""))


def thin_evidence(forced: dict) -> list:
    notes = []
    for q in ("loss", "grads"):
        j = forced[q]
        if j.scale and j.noise > THIN_EVIDENCE * j.scale:
            notes.append(f"equivalent one-device computations of the {q} already differ by "
                         f"{j.noise:.3g}, {100 * j.noise / j.scale:.0f}% of its largest magnitude "
                         f"({j.scale:.3g}; e.g. BatchNorm over few rows per shard): the "
                         f"comparison vouches for no more than that")
    return notes


def tensor_parallel(split, m: int) -> dict:
    """The split as the report shows it, with the notice when nothing is split."""
    out = {"source": split.source, "split": [display_path(p) for p in split.split],
           "replicated": {display_path(p): why for p, why in split.replicated.items()},
           "groups": [{k: [display_path(p) for p in v] for k, v in g.items()}
                      for g in split.groups], "notes": list(split.notes)}
    if m > 1 and not split.split:
        how = {"derived": "no Megatron pair (a matmul whose features a second matmul contracts) "
                          "was found in the loss's dataflow",
               "rules": "no rule splits a parameter over model",
               "annotations": "no annotation maps a parameter onto the model axis"}
        out["notice"] = (f"nothing is split over model={m}: {how.get(split.source, '')}; give "
                         "partition rules ((regex, PartitionSpec) pairs as the factory's 5th "
                         "item) or sharding annotations (flax nn.with_logical_partitioning with "
                         "logical axis rules, or --axis-rules NAME=model,...)")
    return out
