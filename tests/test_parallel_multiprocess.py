"""Multi-process launch: bad counts are clear errors; the 2-process run itself is tested end to end
in tests/experiments/test_s04.py (one launch of 2 workers is enough for the suite's time budget)."""
import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import make_mesh, multiprocess


def test_bad_process_counts():
    with pytest.raises(MlsysError, match="--processes must be >= 2"):
        multiprocess.launch(1, 4)
    with pytest.raises(MlsysError, match=">= 1 device"):
        multiprocess.launch(2, 0)


def test_one_process_demo_is_deterministic_and_mesh_independent():
    cfg = {**multiprocess.SETTINGS, "batch": 8, "sizes": (4, 6, 3), "steps": 1}
    import jax

    two = multiprocess.run_dp_demo(**cfg, mesh=make_mesh({"data": 2}, devices=jax.devices()[:2]))
    four = multiprocess.run_dp_demo(**cfg, mesh=make_mesh({"data": 4}, devices=jax.devices()[:4]))
    assert (two["devices"], four["devices"], two["processes"]) == (2, 4, 1)
    for key in ("losses", "grads", "params"):
        np.testing.assert_allclose(two[key], four[key], rtol=0, atol=1e-12)
