"""The compiled programs of a sharded run: the sharded step and its one-device counterparts.

Every program of one run is compiled with the same XLA options (the compiler's normal settings
unless the caller asks otherwise): a reference compiled at other settings than the run it judges
rounds differently, and that difference would be charged to the mesh.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, NamedTuple

import jax
import numpy as np
import optax


def make_step(loss: Callable, optimizer: optax.GradientTransformation, layout=None) -> Callable:
    """``step(trainable, opt_state, batch) -> (trainable, opt_state, loss, grads)``.

    With a layout the parameters are constrained to their TP sharding for the forward pass (so
    ZeRO-3 gathers them once, §7.3) and the gradients to the stage's sharding.
    """
    def step(t, s, b):
        used = t if layout is None else jax.lax.with_sharding_constraint(t, layout.compute)
        value, grads = jax.value_and_grad(loss)(used, b)
        if layout is not None:  # reduce over data first (every stage), then keep the stage's part
            grads = jax.lax.with_sharding_constraint(grads, layout.compute)
            grads = jax.lax.with_sharding_constraint(grads, layout.grads)
        updates, s = optimizer.update(grads, s, t)
        return optax.apply_updates(t, updates), s, value, grads
    return step


def lower_sharded(setup, mesh_loss: Callable, donate: bool = False) -> tuple:
    """``(lowered, jaxpr)``: the sharded step of ``setup``'s layout differentiating
    ``mesh_loss``, traced (its ClosedJaxpr: a second trace of the step costs as much) and lowered,
    to compile here (:func:`compile_sharded`) or on a compile thread (:func:`in_background`).
    With ``donate`` the new parameters and optimizer state take the buffers of the old ones (the
    step's caller must not use its inputs again)."""
    lay = setup.layout
    fn = jax.jit(make_step(mesh_loss, setup.optimizer, lay),
                 in_shardings=(lay.params, lay.opt_state, lay.batch),
                 out_shardings=(lay.params, lay.opt_state, lay.replicated, lay.grads),
                 donate_argnums=(0, 1) if donate else ())
    trace = fn.trace(setup.trainable, lay.opt_shapes, setup.batch)
    return trace.lower(), trace.jaxpr


class Ahead(NamedTuple):
    """:func:`compile_ahead`'s step: its executable's future, its trace, and what it was
    compiled for (:func:`compile_sharded` takes it for that very step only)."""

    future: Future
    jaxpr: Any
    setup: Any
    mesh_loss: Callable
    options: dict | None
    donate: bool


def compile_sharded(setup, mesh_loss: Callable, options: dict | None = None,
                    donate: bool = False, traced: list | None = None,
                    ahead: Ahead | None = None):
    """The sharded step (:func:`lower_sharded`) compiled. ``traced``: a list that receives the
    step's ClosedJaxpr, the trace this compile made. ``ahead``: :func:`compile_ahead`'s
    :class:`Ahead` for this very step (the same setup and loss, options and donation), whose
    executable is taken instead; another step's is refused."""
    if ahead is not None:
        if not (ahead.setup is setup and ahead.mesh_loss is mesh_loss
                and ahead.options == options and ahead.donate == donate):
            raise ValueError("compile_sharded: the step compiled ahead was compiled for another "
                             "setup, loss, options or donation; pass ahead only with the "
                             "arguments compile_ahead was given")
        jaxpr = ahead.jaxpr
    else:
        lowered, jaxpr = lower_sharded(setup, mesh_loss, donate)
    if traced is not None:
        traced.append(jaxpr)
    return ahead.future.result() if ahead is not None else lowered.compile(options)


def compile_ahead(setup, mesh_loss: Callable, options: dict | None = None,
                  donate: bool = False) -> Ahead:
    """The sharded step lowered here and compiled on a compile thread (:func:`in_background`),
    for :func:`compile_sharded`'s ``ahead``."""
    lowered, jaxpr = lower_sharded(setup, mesh_loss, donate)
    return Ahead(in_background(lowered, options), jaxpr, setup, mesh_loss, options, donate)


# programs compiled at once (XLA compiles each on one core): the whole batch's and the shards'
# are needed first, together; the cores left run the one-device programs meanwhile
_COMPILE_THREADS = 2
_compiles: ThreadPoolExecutor | None = None


def in_background(lowered, options: dict | None = None) -> Future:
    """``lowered.compile(options)`` on a compile thread (XLA compiles outside the GIL), for a
    caller with other work meanwhile; the future's result is the executable, or raises what the
    compile raised. Only XLA runs there: the user's code is traced and lowered on the caller's
    thread."""
    global _compiles
    if _compiles is None:
        _compiles = ThreadPoolExecutor(_COMPILE_THREADS, thread_name_prefix="mlsys-jax-compile")
    return _compiles.submit(lowered.compile, options)


def value_and_grad(loss: Callable, trainable, batch, options: dict | None = None):
    """``loss``'s value and gradient on one device, compiled."""
    return lower_value_and_grad(loss, trainable, batch).compile(options)


def lower_value_and_grad(loss: Callable, trainable, batch):
    """``loss``'s value and gradient on one device, lowered."""
    return jax.jit(jax.value_and_grad(loss)).lower(trainable, batch)


def shard_by_shard(shard_loss: Callable, trainable, batch, n: int, options: dict | None = None):
    """``f(t, b) -> (loss, grads)``: the mean of the per-shard losses computed one shard at a
    time (``shard_loss(index, t, shard)`` compiled once, at one shard's shapes), accumulated."""
    import jax.numpy as jnp

    from mlsys_jax.parallel.shard.inputs import with_rows

    rows = jax.tree.leaves(batch)[0].shape[0] // n
    shard = with_rows(batch, rows)
    one = jax.jit(jax.value_and_grad(lambda t, s, i: shard_loss(i, t, s))).lower(
        trainable, shard, jnp.int32(0)).compile(options)
    add = jax.jit(lambda a, b: jax.tree.map(jnp.add, a, b))
    scale = jax.jit(lambda a: jax.tree.map(lambda x: x / n, a))
    take = jax.jit(lambda b, i: jax.tree.map(
        lambda x: jax.lax.dynamic_slice_in_dim(x, i * rows, rows), b))

    def f(t, b):
        total = None
        for i in range(n):
            part = one(t, take(b, jnp.int32(i)), jnp.int32(i))
            total = part if total is None else add(total, part)
        return scale(total)
    return f


def lower_update(optimizer, trainable, opt_shapes):
    """One device's optimizer alone, lowered: ``advance(g, s, t) -> (t', s')``."""
    def advance(g, s, t):
        u, s = optimizer.update(g, s, t)
        return optax.apply_updates(t, u), s
    return jax.jit(advance).lower(trainable, opt_shapes, trainable)


def copier(shardings) -> Callable:
    """``f(tree)``: fresh copies of a tree's arrays laid out by ``shardings``, which a step may
    donate (``device_put`` hands back the source's own buffer where a replicated layout includes
    its device, so donating that would delete the source)."""
    if jax.process_count() > 1:
        return lambda tree: place(tree, shardings)

    def copy(tree):
        # a leaf that lands whole on a device is copied first (``may_alias=False`` does not stop
        # that aliasing); the others are sliced into fresh shards (no compiled program: a
        # jitted ``x + 0`` compiled on first use and was slower, docs/shard.md)
        fresh = jax.tree.map(lambda x, s: x.copy() if s.shard_shape(x.shape) == x.shape else x,
                             tree, shardings)
        return jax.device_put(fresh, shardings, may_alias=False)
    return copy


def place(tree, shardings):
    """Put host or single-device arrays on the mesh (each process supplies its own shards)."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree.map(lambda x, s: jax.make_array_from_callback(
        x.shape, s, lambda idx, x=np.asarray(x): x[idx]), tree, shardings)  # noqa: B008 (binds each leaf)


def on_one_device(tree):
    """Arrays of the mesh gathered onto this process's first device (the one-device programs'
    inputs)."""
    from mlsys_jax.parallel.shard.compare import host

    if jax.process_count() == 1:
        return jax.device_put(tree, jax.local_devices()[0])
    return jax.tree.map(lambda x: jax.device_put(host(x).astype(x.dtype), jax.local_devices()[0]),
                        tree)


def release_memory(*, generation: int = 2) -> None:
    """Hand freed host memory back to the system between the phases of a run (glibc keeps freed
    blocks of its arenas otherwise, and the next phase's peak lands on top of them).
    ``generation``: the oldest the garbage collector walks. A full collection (2) walks every
    object the process tracks, which in a notebook or a test session holding many models costs
    as much as a small step; between the steps of one loop, what the last step left in reference
    cycles is young, and ``generation=1`` finds it."""
    import ctypes
    import gc

    gc.collect(generation)
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        pass


@contextlib.contextmanager
def collections_of_this_run():
    """Within: the garbage collector's walks (``release_memory``'s full collections included)
    leave out every object the process held before (``gc.freeze``), so they cost what the run
    created, not what a notebook or a test session holds beside it; those objects go back to the
    oldest generation after. Left alone when something has frozen objects already (a nested run,
    or the user's own freeze)."""
    import gc

    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def map_large_blocks(threshold: int = 1 << 20) -> None:
    """From now on, for the rest of the process, let the C allocator map each block of
    ``threshold`` bytes or more on its own and unmap it when freed (glibc's
    ``M_MMAP_THRESHOLD``), so a freed array's memory goes back to the system at once. By default
    glibc raises that threshold as large blocks are freed (up to 32 MiB), and the freed buffers of
    one step stay in the arenas of the threads that held them, where the next step's buffers,
    allocated on other threads, cannot reuse them. For a process of its own (the command's)."""
    import ctypes

    m_mmap_threshold = -3
    try:
        ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, threshold)
    except (OSError, AttributeError):  # not glibc: its allocator's own policy stands
        pass
