"""The MNIST-shaped classifier of TensorFlow's paper, figure 1 (lecture §2.1, §3.3, §8.1).

Written with small named functions so the op view is the lecture's six ops:
``matmul, add, relu, matmul, add, softmax_xent``.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def softmax_xent(logits, labels):
    """Mean softmax cross-entropy against one-hot (or soft) labels; one named op."""
    return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(logits, axis=-1), axis=-1))


def mlp_init(key, sizes=(784, 100, 10), dtype=jnp.float32) -> dict:
    """Parameters ``{'W1','b1','W2','b2',...}`` with scaled-normal weights and zero biases."""
    params = {}
    keys = jax.random.split(key, len(sizes) - 1)
    for i, (k, n_in, n_out) in enumerate(zip(keys, sizes[:-1], sizes[1:]), start=1):
        params[f"W{i}"] = (jax.random.normal(k, (n_in, n_out), jnp.float32) / jnp.sqrt(n_in)).astype(dtype)
        params[f"b{i}"] = jnp.zeros((n_out,), dtype)
    return params


def mlp_logits(params: dict, x):
    """Hidden layers ``relu(x @ W + b)``, then a linear output layer."""
    n = len(params) // 2
    h = x
    for i in range(1, n):
        h = jax.nn.relu(h @ params[f"W{i}"] + params[f"b{i}"])
    return h @ params[f"W{n}"] + params[f"b{n}"]


def mlp_loss(params: dict, x, y):
    """The training loss: ``softmax_xent(mlp_logits(params, x), y)`` with one-hot labels ``y``."""
    return softmax_xent(mlp_logits(params, x), y)


def mnist_batch(key, batch: int, dtype=jnp.float32, sizes=(784, 100, 10)):
    """A random MNIST-shaped batch: inputs ``(batch, 784)`` and one-hot labels ``(batch, 10)``."""
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (batch, sizes[0]), jnp.float32).astype(dtype)
    y = jax.nn.one_hot(jax.random.randint(ky, (batch,), 0, sizes[-1]), sizes[-1], dtype=dtype)
    return x, y
