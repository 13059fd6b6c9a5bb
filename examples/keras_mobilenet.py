"""Keras 3's ``keras.applications.MobileNetV2`` as shipped (``weights=None``), with the JAX
backend, trained the way Keras' JAX guide writes a custom step: ``model.stateless_call`` with the
trainable variables as the parameters and the non-trainable ones (BatchNormalization's moving
statistics) closed over, ``training=True`` so every BatchNormalization normalises by the batch's
own statistics.

    mlsys-jax shard examples/keras_mobilenet.py:train --mesh data=4
"""
import os

os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import keras  # noqa: E402
import optax  # noqa: E402


def train(n: int = 8, size: int = 32, classes: int = 10, alpha: float = 0.35):
    """``(loss_fn, trainable variables, batch, optimizer)`` for a narrow MobileNetV2 on
    ``size``-pixel images (32 is the smallest Keras accepts)."""
    return train_application(keras.applications.MobileNetV2, n=n, size=size, classes=classes,
                             alpha=alpha)


def train_application(application, *, n: int, size: int, classes: int, **options):
    """The same training loss for any ``keras.applications`` constructor (``options`` go to it)."""
    if keras.backend.backend() != "jax":
        raise RuntimeError(f"set KERAS_BACKEND=jax before keras is imported (it is "
                           f"{keras.backend.backend()!r})")
    keras.utils.set_random_seed(0)
    model = application(input_shape=(size, size, 3), weights=None, classes=classes,
                        classifier_activation=None, **options)
    trainable = [v.value for v in model.trainable_variables]
    frozen = [v.value for v in model.non_trainable_variables]
    kx, ky = jax.random.split(jax.random.key(1))
    batch = {"x": jax.random.normal(kx, (n, size, size, 3)),
             "y": jax.random.randint(ky, (n,), 0, classes)}

    def loss_fn(trainable, batch):
        logits, _ = model.stateless_call(trainable, frozen, batch["x"], training=True)
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch["y"]).mean()
    return loss_fn, trainable, batch, optax.adam(1e-3)
