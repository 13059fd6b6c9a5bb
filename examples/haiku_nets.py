"""haiku's own networks as shipped (``hk.nets.MLP``, ``hk.nets.ResNet``), trained the way haiku
code usually is: ``hk.transform`` for the MLP, ``hk.transform_with_state`` for the ResNet, whose
BatchNorm keeps moving averages in haiku *state* (not parameters) and normalises by the batch's
own statistics when ``is_training=True``. haiku's ResNet zero-initialises its logits layer
(``logits_config`` defaults to ``w_init=jnp.zeros``).

    mlsys-jax shard examples/haiku_nets.py:train_mlp --mesh data=2,model=2
    mlsys-jax shard examples/haiku_nets.py:train_resnet --mesh data=4
"""
import haiku as hk
import jax
import optax


def _images(n: int, size: int, classes: int, seed: int = 1) -> dict:
    kx, ky = jax.random.split(jax.random.key(seed))
    return {"x": jax.random.normal(kx, (n, size, size, 3)),
            "y": jax.random.randint(ky, (n,), 0, classes)}


def train_mlp(widths=(64, 64, 10), n: int = 16, features: int = 32):
    """``hk.nets.MLP`` on a classification batch: ``(loss_fn, params, batch, optimizer)``."""
    net = hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP(widths)(x)))
    kx, ky = jax.random.split(jax.random.key(1))
    batch = {"x": jax.random.normal(kx, (n, features)),
             "y": jax.random.randint(ky, (n,), 0, widths[-1])}
    params = jax.jit(net.init)(jax.random.key(0), batch["x"])  # one compile, not one per op

    def loss_fn(params, batch):
        logits = net.apply(params, batch["x"])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn, params, batch, optax.adam(1e-3)


def train_resnet(n: int = 8, size: int = 16, classes: int = 10):
    """A small ``hk.nets.ResNet`` (one block per group, narrow channels) in training mode: the
    loss closes over the haiku state and drops the updated one, as a training step's loss does
    before it returns the state as an auxiliary output."""
    def forward(x, is_training):
        net = hk.nets.ResNet(blocks_per_group=(1, 1, 1, 1), num_classes=classes,
                             bottleneck=False, channels_per_group=(8, 16, 16, 32),
                             initial_conv_config={"output_channels": 8})
        return net(x, is_training)

    net = hk.without_apply_rng(hk.transform_with_state(forward))
    batch = _images(n, size, classes)
    params, state = jax.jit(net.init, static_argnames="is_training")(
        jax.random.key(0), batch["x"], is_training=True)

    def loss_fn(params, batch):
        logits, _ = net.apply(params, state, batch["x"], is_training=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn, params, batch, optax.sgd(0.1, momentum=0.9)
