"""A tf.compat.v1 classifier as TF1-era programs build it with
tf.compat.v1.layers (legacy Keras: tf-keras, TF_USE_LEGACY_KERAS=1): dense
layers, each followed by tf.compat.v1.layers.batch_normalization with
`training=is_training`, a placeholder defaulting to False that the training
steps feed True, the moving statistics' updates in UPDATE_OPS run with the
train op through a control dependency (the layer's docstring's pattern), a
tf.compat.v1.losses loss and Momentum; Config left at its defaults.

For a `training` tensor the layer takes the batch's moments outside any
cond and picks them or the moving statistics with tf.cond (V1 control flow
after disable_v2_behavior(): Switch and Merge); it updates the moving
statistics under another. Between steps every worker evaluates the loss of
its own rows in inference mode (not a training step).
"""
from __future__ import annotations

import tensorflow as tf

# The same data, steps, evaluations between them and optimizer as bn_classifier's
from tests.programs.bn_classifier import CLASSES, HIDDEN, Program, program_of

tf1 = tf.compat.v1


def _loss(x, labels, is_training, dtype) -> tf.Tensor:
    init = tf1.glorot_uniform_initializer(seed=9)
    h = tf1.layers.dense(x, HIDDEN, kernel_initializer=init)
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=is_training))
    h = tf1.layers.dense(h, HIDDEN, kernel_initializer=init)
    h = tf.nn.relu(tf1.layers.batch_normalization(h, training=is_training))
    logits = tf1.layers.dense(h, CLASSES, kernel_initializer=init)
    return tf1.losses.sparse_softmax_cross_entropy(labels, logits)


def build(dtype: str = "float64") -> Program:
    return program_of(dtype, _loss)
