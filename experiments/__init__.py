"""One module per lecture section; each has run(**overrides) -> Result, check(result) (the
lecture's claims, derived from the result alone), plots(result, directory) -> PNG paths, and
main(). A section's parts live beside it as ``_sNN_<subsection>.py`` (``_s05_fusion.py``);
``_inputs.py`` holds the host-built inputs that experiments 05 and 06 share.

IDs are the lecture's script numbers (seed 000 §0.3): 01 autodiff & execution models, 02 graph
optimizations, 03 rematerialization, 04 parallelism; 05 dispatch & fusion (seed 003) and
06 frameworks (seed 001).
"""
from __future__ import annotations

import importlib

EXPERIMENTS: dict[str, str] = {
    "01": "experiments.s01_autodiff",
    "02": "experiments.s02_graph_opt",
    "03": "experiments.s03_remat",
    "04": "experiments.s04_parallel",
    "05": "experiments.s05_dispatch_fusion",
    "06": "experiments.s06_frameworks",
}


def load(eid: str):
    """Import an experiment module by ID ('02', '2', 's02' or the module's short name)."""
    key = eid.lower().lstrip("s")
    key = key.zfill(2) if key.isdigit() else key
    for k, mod in EXPERIMENTS.items():
        if key in (k, mod.rsplit(".", 1)[1], mod.rsplit(".", 1)[1][4:]):
            return importlib.import_module(mod)
    raise LookupError(f"unknown experiment {eid!r}; choose one of {', '.join(EXPERIMENTS)} or 'all'")
