"""A layout's recomputation applied to a user's ``loss_fn(params, batch)``: as the user wrote it,
or every scan body of more than one trip checkpointed under a policy
(``remat.planner.scan_bodies``). One function, read by the plan's compiles and by
``shard --layout``."""
from __future__ import annotations

from mlsys_jax.errors import MlsysError
from mlsys_jax.planning.candidates import AS_WRITTEN


def with_remat(loss_fn, params, remat: str | None):
    """``loss_fn`` under ``remat`` (None or ``AS_WRITTEN``: itself). The static leaves of
    ``params`` (non-float: an equinox activation, an int buffer) are those of ``params``."""
    from mlsys_jax.parallel.shard import inputs
    from mlsys_jax.remat.planner.scan_bodies import POLICIES, with_bodies_checkpointed

    if remat in (None, AS_WRITTEN):
        return loss_fn
    if remat not in POLICIES:
        raise MlsysError(f"remat {remat!r}: a layout's recomputation is {AS_WRITTEN!r} or a scan "
                         f"body's policy ({', '.join(POLICIES)})")
    _, rest = inputs.split_params(params)
    inner = with_bodies_checkpointed(lambda t, b: loss_fn(inputs.combine(t, rest), b), remat)

    def loss(p, batch):
        return inner(inputs.split_params(p)[0], batch)
    return loss
