"""The programs compiled from the loss traced once (``FlatLoss.replay``) are the modules the user's
own function lowers to: no remat, each built-in policy and a names policy (``checkpoint_name``'s
equations survive the trace); the user's Python runs once for the frontier and the policies."""
import jax
import jax.numpy as jnp
import pytest
from jax.ad_checkpoint import checkpoint_name

from mlsys_jax.remat.planner.flat import flatten_loss
from mlsys_jax.remat.planner.frontier import Frontier
from mlsys_jax.remat.planner.policies import BUILTIN_POLICIES, policy_programs
from mlsys_jax.remat.planner.programs import _fingerprint

CALLS = []


@jax.jit
def _block(h, w):                     # a jit call inside the loss, as flax's modules make them
    return checkpoint_name(jnp.tanh(h @ w), "act")


def loss(ws, x):
    CALLS.append(1)
    h = x
    for i in range(ws.shape[0]):
        h = h + jax.nn.gelu(_block(h, ws[i]))
    return jnp.mean(jax.nn.relu(h) ** 2)          # relu: a custom_jvp equation


def _args():
    return jnp.full((3, 16, 16), 0.1), jnp.ones((8, 16))


def _print(fn, flat) -> str:
    return _fingerprint(jax.jit(jax.grad(fn)).trace(flat.diff, flat.batch).lower())


POLICIES = [None, *(getattr(jax.checkpoint_policies, n) for n in BUILTIN_POLICIES),
            jax.checkpoint_policies.save_only_these_names("act")]


@pytest.mark.parametrize("policy", POLICIES, ids=["no remat", *BUILTIN_POLICIES, "names"])
def test_the_replayed_loss_lowers_to_the_users_module(policy):
    with jax.enable_x64(False):
        flat = flatten_loss(loss, *_args())
        if policy is None:
            assert _print(flat.replay, flat) == _print(flat.fn, flat)
        else:
            assert _print(jax.checkpoint(flat.replay, policy=policy), flat) == \
                _print(jax.checkpoint(flat.fn, policy=policy), flat)


def test_names_policy_sees_the_names_in_the_trace():
    """Saving the named value changes the module against saving nothing: the name is there."""
    with jax.enable_x64(False):
        flat = flatten_loss(loss, *_args())
        named = jax.checkpoint_policies.save_only_these_names("act")
        nothing = jax.checkpoint_policies.nothing_saveable
        assert _print(jax.checkpoint(flat.replay, policy=named), flat) != \
            _print(jax.checkpoint(flat.replay, policy=nothing), flat)


def test_the_users_loss_runs_once_for_the_frontier_and_the_policies():
    with jax.enable_x64(False):
        CALLS.clear()
        fr = Frontier(loss, *_args())
        built = policy_programs(fr, quick=True)
    assert len(CALLS) == 1
    assert set(built) == set(BUILTIN_POLICIES)
    assert built["checkpoint_dots"].fingerprint == built["dots_saveable"].fingerprint
