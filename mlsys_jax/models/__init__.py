"""Small pure-function models shared by the experiments (named so the op view matches the lecture)."""
from mlsys_jax.models.branchy import branchy, branchy_cond, branchy_where, mlp2
from mlsys_jax.models.mlp import mlp_init, mlp_logits, mlp_loss, mnist_batch, softmax_xent
from mlsys_jax.models.resnet import (batch_norm, conv, conv_bias, enlarge_block_params,
                                     enlarge_kernel, fold_block_params, fold_bn,
                                     merge_block_params, resnet_block, resnet_block_folded,
                                     resnet_block_init, resnet_block_merged)

__all__ = ["branchy", "branchy_cond", "branchy_where", "mlp2", "mlp_init", "mlp_logits", "mlp_loss", "mnist_batch", "softmax_xent", "batch_norm",
           "conv", "conv_bias", "enlarge_block_params", "enlarge_kernel", "fold_block_params",
           "fold_bn", "merge_block_params", "resnet_block", "resnet_block_folded",
           "resnet_block_init", "resnet_block_merged"]
