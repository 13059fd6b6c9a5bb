"""The capture oracle's CI tier: 200 random branchy programs, each equal to eager bitwise.

The hand-run tier is ``python -m mlsys_jax.fuzz.capture_oracle --programs 2000 --seed 0``.
"""
import pytest

from mlsys_jax.fuzz.capture_oracle import CI, run_campaign

CHUNKS, PER_CHUNK = 4, 50  # 200 programs, in chunks that pytest-xdist can spread


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_branchy_programs_equal_eager(chunk):
    res = run_campaign(PER_CHUNK, seed=11, first=chunk * PER_CHUNK, calls=CI["calls"],
                       generate_options=CI["generate"])
    assert res["programs"] == PER_CHUNK
    assert res["mismatches"] == [], res["mismatches"][0]
    # every replay mode was exercised: cold runs, segment walks and one-program replays
    assert min(res["modes"].get(m, 0) for m in ("cold", "warm", "fused")) > 0, res["modes"]
