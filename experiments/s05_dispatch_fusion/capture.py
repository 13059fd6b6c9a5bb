"""Experiment 05, section 5 — graph capture (``mlsys_jax.capture``) of the small model, beside eager
and ``jax.jit``."""
from __future__ import annotations

import numpy as np

from mlsys_jax import timing
from mlsys_jax.execute import capture


def capture_rows(small: dict, repeats: int) -> tuple[list[dict], str]:
    """The same model under graph-break capture, beside eager and jit: table rows and a note."""
    fn, args = small["fn"], small["args"]
    captured, jitted = capture(fn), small["jit"]
    eager_out = fn(*args)
    t = timing.compare({"eager": lambda: fn(*args), "captured": lambda: captured(*args),
                        "jit": lambda: jitted(*args)}, repeats=repeats)
    rows = [{"mode": mode, "us": t[mode].median_us,
             "speedup_vs_eager": timing.ratio(t["eager"], t[mode]).median,
             "matches_eager": bool(np.allclose(np.asarray(out), np.asarray(eager_out),
                                               rtol=1e-6, atol=0))}
            for mode, out in (("eager", eager_out), ("captured", captured(*args)),
                              ("jit", jitted(*args)))]
    return rows, (f"graph capture ({small['name']}): warm captured calls replay the recorded "
                  "graph without re-running Python op by op")
