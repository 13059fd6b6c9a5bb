"""Layer stacks to run as pipeline stages, written the way each library's users write them:
factories ``(loss_fn, params, batch, optimizer)`` for ``mlsys-jax shard --mesh [data=D,]pipe=P``.

    mlsys-jax shard examples/pipeline_stacks.py:transformer8 --mesh pipe=4 --microbatches 8
    mlsys-jax shard examples/pipeline_stacks.py:haiku_mlp --mesh data=2,pipe=4 --microbatches 8
    mlsys-jax shard examples/pipeline_stacks.py:scan_mlp --mesh pipe=4 --microbatches 8 --remat

* ``transformer8``: ``flax_transformer.Transformer`` with 8 blocks (flax linen pushes each
  block's name, ``Block_3``, onto its equations' name stacks);
* ``haiku_mlp``: ``hk.nets.MLP`` as haiku ships it (``mlp/~/linear_3``);
* ``equinox_mlp``: ``eqx.nn.MLP``, the module being the parameter pytree (``layers[3]``);
* ``scan_mlp``: ``flax_scan.ScanMLP``, 16 blocks under ``nn.scan`` (parameters stacked 16 deep);
* ``batchnorm_mlp``: a training-mode BatchNorm MLP, whose loss mixes a batch's examples.
"""
import equinox as eqx
import flax.linen as nn
import haiku as hk
import jax
import optax

import flax_scan
import flax_transformer
from flax_mlp import batch_of


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def transformer(layers=8, d_model=64, heads=4, hidden=128, vocab=128, rows=16, seq=16):
    model = flax_transformer.Transformer(layers=layers, d_model=d_model, heads=heads,
                                         hidden=hidden, vocab=vocab)
    batch = flax_transformer.batch_of(rows, seq, vocab)
    variables = jax.jit(model.init)(jax.random.key(0), batch["tokens"])
    return flax_transformer.loss_of(model), variables, batch, optax.adamw(1e-3)


def transformer8():
    return transformer()


def haiku_mlp_of(depth=12, width=64, features=32, classes=10, rows=16):
    net = hk.without_apply_rng(hk.transform(
        lambda x: hk.nets.MLP([width] * depth + [classes])(x)))
    batch = batch_of(rows, features, classes)
    params = jax.jit(net.init)(jax.random.key(0), batch["x"])  # one compile, not one per op
    return (lambda p, b: _xent(net.apply(p, b["x"]), b["y"])), params, batch, optax.adamw(1e-3)


def haiku_mlp():
    return haiku_mlp_of()


def equinox_mlp_of(depth=12, width=64, features=32, classes=10, rows=16):
    model = eqx.nn.MLP(features, classes, width, depth, key=jax.random.key(0))
    batch = batch_of(rows, features, classes)
    return (lambda m, b: _xent(jax.vmap(m)(b["x"]), b["y"])), model, batch, optax.adamw(1e-3)


def equinox_mlp():
    return equinox_mlp_of()


def scan_mlp_of(rows=16, features=32):
    model = flax_scan.ScanMLP()
    batch = batch_of(rows, features, model.classes)
    variables = jax.jit(model.init)(jax.random.key(0), batch["x"])
    return ((lambda v, b: _xent(model.apply(v, b["x"]), b["y"])), variables, batch,
            optax.adamw(1e-3))


def scan_mlp():
    return scan_mlp_of()


class BatchNormMLP(nn.Module):
    depth: int = 6

    @nn.compact
    def __call__(self, x):
        for _ in range(self.depth):
            x = nn.relu(nn.BatchNorm(use_running_average=False)(nn.Dense(32)(x)))
        return nn.Dense(10)(x)


def batchnorm_mlp(depth=6):
    model = BatchNormMLP(depth)
    batch = batch_of(16, 32, 10)
    variables = jax.jit(model.init)(jax.random.key(0), batch["x"])

    def loss_fn(variables, batch):
        logits, _ = model.apply(variables, batch["x"], mutable=["batch_stats"])
        return _xent(logits, batch["y"])
    return loss_fn, variables, batch, optax.adamw(1e-3)
