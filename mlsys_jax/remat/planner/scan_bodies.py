"""Recomputation per layer for a model whose layers are a scan (``nn.scan``, ``lax.scan``,
``eqx.filter_scan``-style stacks): each scan body wrapped in ``jax.checkpoint`` under a policy.

The planner's MILP sees a scan as one equation: recomputing it in the backward re-runs the whole
scan, whose own linearization keeps every layer's residuals again, so no plan of it frees a
layer's activations. What frees them is checkpointing the *body*: the backward scan then keeps
only each layer's inputs (the carry and its slice of the stacked weights) and recomputes one
layer at a time — what ``nn.remat`` inside ``nn.scan`` does when a user writes it. So when a
loss has scans of more than one trip whose bodies are not checkpointed already, these programs
are candidates beside the MILP's plans, one per policy in ``POLICIES`` (what a body saves:
nothing, or the matmul outputs without batch dimensions, or every matmul output).

The loss's jaxpr is re-evaluated with each such scan bound again with its body checkpointed;
scans inside ``jit`` calls are reached by inlining the call (XLA inlines it too). Scans inside
other bodies (``cond``, ``custom_vjp``, another scan) are left as they are.
"""
from __future__ import annotations

import jax

from mlsys_jax.compat import DropVar, Literal, bind_equation, jaxpr_as_fun

POLICIES = ("nothing_saveable", "dots_with_no_batch_dims_saveable", "dots_saveable")
CALLS = ("jit", "pjit", "closed_call")
CHECKPOINT = ("remat2", "checkpoint")      # remat_p's name (JAX 0.10: "remat2")


def _checkpointed(body) -> bool:
    return any(e.primitive.name in CHECKPOINT for e in body.jaxpr.eqns)


def eligible(eqn) -> bool:
    """A scan of more than one trip whose body is not checkpointed already."""
    return (eqn.primitive.name == "scan" and int(eqn.params["length"]) > 1
            and not _checkpointed(eqn.params["jaxpr"]))


def scans_to_checkpoint(jaxpr) -> int:
    """How many scans of ``jaxpr`` (through ``jit`` calls) a body checkpoint would change."""
    n = 0
    for eqn in jaxpr.eqns:
        if eligible(eqn):
            n += 1
        elif eqn.primitive.name in CALLS:
            n += scans_to_checkpoint(eqn.params["jaxpr"].jaxpr)
    return n


def _body_checkpointed(body, policy: str):
    fn = jax.checkpoint(jaxpr_as_fun(body), prevent_cse=False,
                        policy=getattr(jax.checkpoint_policies, policy))
    return jax.make_jaxpr(fn)(*[v.aval for v in body.jaxpr.invars])


def _bind_checkpointed(eqn, invals, policy: str) -> list:
    """Bind a scan equation again with its body under ``jax.checkpoint(policy=policy)``."""
    params = {**eqn.params, "jaxpr": _body_checkpointed(eqn.params["jaxpr"], policy)}
    return list(eqn.primitive.bind(*invals, **params))


def evaluate(jaxpr, consts, args, policy: str) -> list:
    """``jaxpr``'s outputs on ``args``, every eligible scan bound with its body checkpointed."""
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    read = lambda v: v.val if isinstance(v, Literal) else env[v]  # noqa: E731
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        if eligible(eqn):
            outs = _bind_checkpointed(eqn, invals, policy)
        elif eqn.primitive.name in CALLS and scans_to_checkpoint(eqn.params["jaxpr"].jaxpr):
            inner = eqn.params["jaxpr"]
            outs = evaluate(inner.jaxpr, inner.consts, invals, policy)
        else:
            outs = bind_equation(eqn, invals)
        env.update((v, o) for v, o in zip(eqn.outvars, outs) if not isinstance(v, DropVar))
    return [read(v) for v in jaxpr.outvars]


def with_bodies_checkpointed(fn, policy: str):
    """``fn`` with every eligible scan body under ``jax.checkpoint(policy=policy)``: the same
    outputs, the same pytree (traced again for each new set of argument shapes).

    >>> import jax, jax.numpy as jnp
    >>> def f(w, x):
    ...     h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w)
    ...     return h.sum()
    >>> w, x = jnp.ones((4, 3, 3)) / 3, jnp.ones(3)
    >>> g = with_bodies_checkpointed(f, "nothing_saveable")
    >>> bool(jnp.allclose(jax.grad(g)(w, x), jax.grad(f)(w, x)))
    True
    """
    traced = {}

    def checkpointed(*call_args):
        leaves, tree = jax.tree_util.tree_flatten(call_args)
        key = (tree, tuple((tuple(jax.numpy.shape(x)), jax.numpy.result_type(x))
                           for x in leaves))
        if key not in traced:
            specs = [jax.ShapeDtypeStruct(k[0], k[1]) for k in key[1]]
            closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(
                *jax.tree_util.tree_unflatten(tree, specs))
            traced[key] = closed, jax.tree_util.tree_structure(out_shape)
        closed, out_tree = traced[key]
        return jax.tree_util.tree_unflatten(out_tree, evaluate(closed.jaxpr, closed.consts,
                                                                leaves, policy))
    return checkpointed
