"""2 processes × 2 CPU devices through jax.distributed (gloo on 127.0.0.1) == one process."""
import numpy as np
import pytest

from mlsys_jax.errors import MlsysError
from mlsys_jax.parallel import multiprocess


def test_two_processes_equal_one_process():
    settings = {"batch": 8, "sizes": (4, 6, 3), "steps": 1}
    many = multiprocess.launch(2, 2, settings, timeout=240)
    assert (many["devices"], many["processes"], many["ranks_agree"]) == (4, 2, True)
    # the same 4-device mesh in this process (the first 4 of the 8 test devices)
    import jax

    from mlsys_jax.parallel.mesh import make_mesh

    cfg = {**multiprocess.SETTINGS, **settings}
    one = multiprocess.run_dp_demo(**cfg, mesh=make_mesh({"data": 4}, devices=jax.devices()[:4]))
    for key in ("losses", "grads", "params"):
        np.testing.assert_allclose(many[key], one[key], rtol=0, atol=1e-12)


def test_bad_process_counts():
    with pytest.raises(MlsysError, match="--processes must be >= 2"):
        multiprocess.launch(1, 4)
    with pytest.raises(MlsysError, match=">= 1 device"):
        multiprocess.launch(2, 0)
