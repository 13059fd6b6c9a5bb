"""How ``simulate`` runs a user's step on a mesh: one keyword-only value with the command line's
defaults, which the ``shard`` command builds once and hands to its worker processes as JSON.

>>> from mlsys_jax.parallel.shard.options import ShardOptions
>>> options = ShardOptions(zero=3, steps=2)
>>> options.zero, options.time_repeats
(3, 0)
>>> ShardOptions.from_json(options.to_json()) == options
True
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class ShardOptions:
    """The settings of one sharded run (the model's own pieces are ``simulate``'s arguments)."""

    zero: int = 0                     # ZeRO stage (parallel/stages.py)
    steps: int = 3
    axis_rules: tuple | None = None   # logical axis rules (--axis-rules), parsed
    axis_names: dict | None = None    # {the model's axis name: 'data'} (--axis-name)
    xla_options: dict | None = None   # XLA compile options for every program of the run
    time_repeats: int = 0             # timing rounds (--time: 5); 0 runs none: the verdict
    #                                   needs no wall-clock
    keep_params: bool = False         # keep the mesh's final parameters (report.sharded)
    record: object = None             # a directory for each step's values, or a run.Recorder
    progress: bool = False            # phase lines on stderr
    separable: bool | None = None     # a verdict reached elsewhere (another process's)
    judge: bool = True                # False: only run and record the steps

    def to_json(self) -> dict:
        """The options as a JSON object (``record`` must then be a directory or None)."""
        out = dataclasses.asdict(self)
        if out["axis_rules"] is not None:
            out["axis_rules"] = [list(r) for r in out["axis_rules"]]
        return out

    @classmethod
    def from_json(cls, obj: dict) -> "ShardOptions":
        obj = dict(obj)
        if obj.get("axis_rules") is not None:
            obj["axis_rules"] = tuple(tuple(r) for r in obj["axis_rules"])
        return cls(**obj)
