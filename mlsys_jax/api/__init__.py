"""The Python API: the commands ``inspect``, ``optimize``, ``remat`` and ``shard`` as functions
(``mlsys_jax.inspect(f, *args)`` ...), each returning a result whose ``repr`` is the headline,
``.table()`` the command's text report, ``.to_json()`` its ``--json`` object (docs/api.md).

One module per function (``inspecting``, ``optimizing``, ``recomputing``, ``sharding``), the
result they share (``result``), the flags said as keywords (``speak``) and the bridge to the
commands and to a child process with more devices (``bridge``). Importing this package does not
import JAX; a call does.
"""
from mlsys_jax.api.inspecting import InspectResult, inspect
from mlsys_jax.api.optimizing import OptimizeResult, optimize
from mlsys_jax.api.recomputing import RematResult, remat
from mlsys_jax.api.result import ApiResult
from mlsys_jax.api.sharding import ShardResult, shard

__all__ = ["inspect", "optimize", "remat", "shard", "ApiResult", "InspectResult",
           "OptimizeResult", "RematResult", "ShardResult"]
