"""The capture oracle's CI tier: 60 random branchy programs, each equal to eager bitwise —
stateful ones among them, whose globals change between calls and whose side effects must match —
every replay mode exercised, and the programs it caught kept as regressions.

Volume is the hand-run tier's: ``python -m mlsys_jax.fuzz.capture_oracle --programs 2000 --seed 0``.
"""
import pytest

from mlsys_jax.fuzz.capture_oracle import (CALLS, CI, CI_PROGRAMS, STATE_RATE, check,
                                           program_seed, run_campaign)
from mlsys_jax.fuzz.capture_programs import generate

pytestmark = pytest.mark.campaign

CHUNKS, PER_CHUNK = 3, 20  # 60 programs, in chunks that pytest-xdist can spread


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_random_branchy_programs_equal_eager(chunk):
    res = run_campaign(PER_CHUNK, seed=11, first=chunk * PER_CHUNK, calls=CI["calls"],
                       generate_options=CI["generate"])
    assert res["programs"] == PER_CHUNK and res["stateful"] > PER_CHUNK // 5
    assert res["mismatches"] == [], res["mismatches"][0]
    # every replay mode was exercised: cold runs, segment walks and one-program replays
    assert min(res["modes"].get(m, 0) for m in ("cold", "warm", "fused")) > 0, res["modes"]


# Programs the oracle caught, kept: each differed from eager in one compiled program while XLA's
# fusion was on — ``where(y > x, y, x)`` with a subnormal ``y`` became a ``max`` (denormals read
# as zero), and ``v - logsumexp(v)`` on 3×3 values took another code path for ``log``'s tail.
REGRESSIONS = [(11000228, CI_PROGRAMS, CI["calls"]), (101, {}, CALLS)]


@pytest.mark.slow
@pytest.mark.parametrize("index", [178, 651])
def test_caught_programs_with_max_of_one_value_twice_stay_equal_to_eager(index):
    # max(y, y) of a subnormal y: eager's dispatch reads it as zero, a program folded it to y
    res = check(generate(program_seed(25, index), state_rate=STATE_RATE), CALLS)
    assert res["mismatch"] is None, res


@pytest.mark.parametrize("seed, options, calls", REGRESSIONS, ids=lambda v: str(v)[:12])
def test_caught_programs_stay_equal_to_eager(seed, options, calls):
    res = check(generate(seed, **options), calls)
    assert res["mismatch"] is None, res
    assert "fused" in res["modes"]
