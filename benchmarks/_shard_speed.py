"""`mlsys-jax shard` beside a plain ``jax.jit`` + ``NamedSharding`` script of the same steps:
whole processes, back to back.

The plain script (``PLAIN``) is what a user writes to run the same training steps on the same
mesh: start Python, build the model, place the state with ``NamedSharding`` (the layout ``shard``
uses: its specs come from ``shard``'s ``prepare``, whose seconds the script reports and the
figure leaves out, as if the specs were written in), compile the step once and run it
``STEPS`` times. ``shard`` does that and checks the verdict: the one-device reference, the noise
of an equivalent computation, the separability check, the bytes and collectives. The ratio is the
shard process's wall time over the plain script's; the plain script runs before and after the
shard run and the figure is over their mean, so load that comes and goes weighs on both.

The quick tier runs GPT-2's tiny configuration (``examples/flax_gpt2.py:train_tiny``) and the
plain script once, right before the shard run: both processes are mostly Python, JAX and the
command starting (a larger configuration or a second plain run costs ~10 CPU-s and changes
little); the full tier runs GPT-2 small (``examples/flax_gpt2.py:train``).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from benchmarks._processes import cli, timed

ROOT = Path(__file__).resolve().parent.parent
MESH, ZERO, STEPS, DEVICES = {"data": 4, "model": 2}, 3, 2, 8
FULL = "examples/flax_gpt2.py:train"
QUICK = "examples/flax_gpt2.py:train_tiny"

PLAIN = """
import json, os, sys, time
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={devices}"
import jax
sys.path.insert(0, {root!r})
from mlsys_jax.cli.target import load_factory
from mlsys_jax.parallel.shard.setup import prepare
from mlsys_jax.parallel.shard.step import make_step
with jax.enable_x64(False):
    loss_fn, params, batch, optimizer, _ = load_factory({target!r}, "(loss_fn, params, batch, optimizer[, rules])")
    t0 = time.perf_counter()
    lay = prepare(loss_fn, params, batch, optimizer, {mesh!r}, {zero}).layout  # the specs
    prepare_s = time.perf_counter() - t0
    step = jax.jit(make_step(loss_fn, optimizer, lay),
                   in_shardings=(lay.params, lay.opt_state, lay.batch),
                   out_shardings=(lay.params, lay.opt_state, lay.replicated, lay.grads),
                   donate_argnums=(0, 1))
    t = jax.device_put(params, lay.params)
    s = jax.jit(optimizer.init, out_shardings=lay.opt_state)(t)
    b = jax.device_put(batch, lay.batch)
    for _ in range({steps}):
        t, s, loss, grads = step(t, s, b)
    print(json.dumps({{"prepare_s": prepare_s, "loss": float(loss)}}))
"""


EFFICIENTNET = "benchmarks/_shard_speed.py:keras_efficientnet"


def _plain(target: str, mesh: dict = MESH, zero: int = ZERO) -> dict:
    code = PLAIN.format(root=str(ROOT), target=target, mesh=mesh, zero=zero, steps=STEPS,
                        devices=DEVICES)
    run = timed([sys.executable, "-c", code])
    got = json.loads(run["stdout"].strip().splitlines()[-1])
    return {**run, **got, "seconds": run["wall_s"] - got["prepare_s"]}


def _shard(target: str, mesh: dict = MESH, zero: int = ZERO) -> dict:
    axes = ",".join(f"{k}={v}" for k, v in mesh.items())
    run = timed(cli("--devices", str(DEVICES), "shard", target, "--mesh", axes, "--zero",
                    str(zero), "--steps", str(STEPS), "--json"))
    return {**run, **json.loads(run["stdout"])}


def over_plain(quick: bool, *, target: str | None = None, mesh: dict = MESH,
               zero: int = ZERO) -> dict:
    """``{"ratio", "shard_s", "plain_s": [before, after], "exact", "semantics", "target"}``:
    the shard command's wall seconds over the plain script's (its mean before and after; the
    quick tier: ``plain_s`` is ``[before]``). ``target``: GPT-2 (small; tiny when ``quick``)
    unless given."""
    target = target or (QUICK if quick else FULL)
    print(f"[bench parallel] shard {target} beside a plain NamedSharding script, back to back "
          f"({'seconds' if quick else 'minutes'}) ...", file=sys.stderr, flush=True)
    plain_s = [_plain(target, mesh, zero)["seconds"]]
    shard = _shard(target, mesh, zero)
    if not quick:
        plain_s.append(_plain(target, mesh, zero)["seconds"])
    return {"ratio": shard["wall_s"] / (sum(plain_s) / len(plain_s)), "shard_s": shard["wall_s"],
            "plain_s": plain_s, "exact": shard["exact"],
            "semantics": shard["semantics"], "target": target}


def keras_efficientnet(n: int = 4, size: int = 64, classes: int = 10):
    """``(loss_fn, trainable variables, batch, optimizer)``: Keras 3's ``EfficientNetV2B0`` as
    shipped (``weights=None``, JAX backend, ``stateless_call`` with ``training=True``: every
    BatchNormalization normalises by the batch's own statistics), at ``size`` pixels — the
    model whose separability its BatchNorm settles (``--mesh data=2``)."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    sys.path.insert(0, str(ROOT / "examples"))
    from keras_mobilenet import train_application

    return train_application(keras.applications.EfficientNetV2B0, n=n, size=size,
                             classes=classes)
