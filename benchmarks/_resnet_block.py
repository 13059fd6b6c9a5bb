"""The §4.2 ResNet block in float32, traced, with its five graph-optimization steps: the graph
that `bench passes`, the CPU roofline check and the `--hw here` search all measure."""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from mlsys_jax import ir, models


def traced_block(shape: tuple):
    """The block's ClosedJaxpr on an input of ``shape`` (n, c, h, w) and its five steps."""
    from experiments.s02_graph_opt import block_params, five_steps

    params = block_params(shape[1], jnp.float32, 0)
    closed = ir.trace(partial(models.resnet_block, params), jax.ShapeDtypeStruct(shape, jnp.float32))
    return closed, five_steps(closed)


def block_graphs(quick: bool):
    """The block (shape, its graphs before, folded, enlarged and optimized, an input)."""
    shape = (4, 64, 28, 28) if quick else (16, 64, 56, 56)  # (n, c, h, w)
    closed, steps = traced_block(shape)
    x = jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.float32)
    graphs = {"original": closed, "folded": steps[1][0], "enlarged": steps[3][0],
              "optimized": steps[-1][0]}
    return shape, graphs, x
