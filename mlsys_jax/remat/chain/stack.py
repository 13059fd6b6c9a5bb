"""Chain schedules (every_k, sqrt_n, optimal_chain, …) on a user's layer stack (lecture §7.2).

A stack is either one layer function scanned over parameters stacked on a leading axis —
``layer(p_i, h) -> h`` with ``params`` a pytree whose leaves have n rows, as flax ``nn.scan`` /
``nnx.scan`` and equinox ``filter_vmap``-built stacks keep them — or a list of n layer functions
``[f_i(p_i, h) -> h]`` with a list of n parameter pytrees. :func:`chain` returns ``run(params,
h) -> h`` applying the schedule's ``jax_plan``: runs of layers kept whole, ``("remat", sub)``
segments whose residuals are dropped and recomputed in the backward (JAX's convention: a
segment is recomputed whole).

How each survives XLA (measured on XLA:CPU; see ``xla_remat``): a scanned stack becomes
``scan(checkpoint(scan(layer)))`` (repeated identical segments an outer scan): a loop body is not
merged with the forward. A list of layers cannot be a loop, so each segment is an
``xla_remat.checkpoint`` (recomputation pinned in a conditional).
"""
from __future__ import annotations

import jax

from mlsys_jax.errors import MlsysError
from mlsys_jax.remat import xla_remat
from mlsys_jax.remat.chain.schedule import Schedule, plan_length


def _rows(params, start: int, stop: int):
    return jax.tree_util.tree_map(lambda a: a[start:stop], params)


def run_scanned(plan: tuple, layer, params, h, pin: bool = False):
    """Apply ``layer`` over the rows of ``params`` to ``h`` following ``plan``.

    A segment that is not repeated is not in a loop; with ``pin`` it is an
    ``xla_remat.checkpoint`` (else a plain ``jax.checkpoint``, which XLA:CPU undoes: experiment
    03 shows the lecture's structure as JAX writes it)."""
    off, parts = 0, list(plan)
    while parts:
        part = parts.pop(0)
        if isinstance(part, int):
            h, _ = jax.lax.scan(lambda h, p: (layer(p, h), None), h, _rows(params, off, off + part))
            off += part
            continue
        reps = 1                               # identical consecutive segments -> outer scan
        while parts and parts[0] == part:
            parts.pop(0)
            reps += 1
        sub = part[1]
        length = plan_length(sub)
        seg = jax.checkpoint(lambda h, p, sub=sub: run_scanned(sub, layer, p, h, pin),
                             prevent_cse=True)
        if reps == 1 and pin:
            pinned = xla_remat.checkpoint(
                lambda h, p, sub=sub: (run_scanned(sub, layer, p, h, pin),))
            h = pinned(h, _rows(params, off, off + length))[0]
        elif reps == 1:
            h = seg(h, _rows(params, off, off + length))
        else:
            stacked = jax.tree_util.tree_map(
                lambda a: a.reshape((reps, length) + a.shape[1:]),  # noqa: B023 (called in this iteration)
                _rows(params, off, off + reps * length))
            h, _ = jax.lax.scan(lambda h, p: (seg(h, p), None), h, stacked)  # noqa: B023 (called in this iteration)
        off += reps * length
    return h


def _run_list(plan: tuple, layers, params, h):
    off = 0
    for part in plan:
        if isinstance(part, int):
            for f, p in zip(layers[off:off + part], params[off:off + part]):
                h = f(p, h)
            off += part
            continue
        n = plan_length(part[1])
        sub, fs = part[1], layers[off:off + n]
        seg = xla_remat.checkpoint(lambda ps, h, sub=sub, fs=fs: (_run_list(sub, fs, ps, h),))
        h = seg(list(params[off:off + n]), h)[0]
        off += n
    return h


def _count(params) -> set:
    return {a.shape[0] if a.ndim else 0 for a in jax.tree_util.tree_leaves(params)}


def chain(schedule: Schedule, layer):
    """``run(params, h) -> h``: the stack's layers under ``schedule``'s recomputation.

    Example (flax ``nn.scan`` parameters, 16 blocks, a checkpoint every 4)::

        run = chain(every_k(16, 4), lambda p, h: Block().apply({"params": p}, h))
        h = run(variables["params"]["blocks"], h)
    """
    if not isinstance(schedule, Schedule):
        raise MlsysError(f"chain: expected a Schedule (every_k, sqrt_n, optimal_chain, …), got "
                         f"{type(schedule).__name__}")
    n = schedule.n
    if isinstance(layer, (list, tuple)):
        if len(layer) != n or not all(callable(f) for f in layer):
            raise MlsysError(f"chain: the schedule is for {n} layers but {len(layer)} were "
                             "given; pass one function per layer (or one function to scan)")

        def run_list(params, h):
            if not isinstance(params, (list, tuple)) or len(params) != n:
                raise MlsysError(f"chain: pass a list of {n} parameter pytrees, one per layer")
            return _run_list(schedule.jax_plan, list(layer), list(params), h)
        return run_list
    if not callable(layer):
        raise MlsysError(f"chain: layer must be a function layer(p, h) -> h or a list of "
                         f"them, got {type(layer).__name__}")

    def run(params, h):
        rows = _count(params)
        if rows != {n}:
            raise MlsysError(f"chain: the schedule is for {n} layers but the stacked parameters "
                             f"have leading axes {sorted(rows)}; stack one row per layer")
        return run_scanned(schedule.jax_plan, layer, params, h, pin=True)
    return run
