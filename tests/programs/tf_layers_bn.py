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

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

FEATURES, HIDDEN, CLASSES = 5, 8, 3


@dataclass
class Program:
    graph: tf.Graph
    fetches: dict
    inputs: tuple
    config: dict = field(default_factory=dict)

    def step(self, k: int, rows, global_batch: int):
        """(fetch, feed) of step k for the rows `rows` of its global batch."""
        rng = np.random.default_rng(900 + k)
        x = rng.normal(size=(global_batch, FEATURES)) * 2.0 + 1.0
        y = rng.integers(0, CLASSES, size=global_batch)
        return self.fetches["train"], {self.inputs[0]: x[rows], self.inputs[1]: y[rows],
                                       self.inputs[2]: True}

    def between_steps(self, k: int, rows, global_batch: int):
        """(fetch, feed) of what the program runs after step k: the loss of
        its rows of step k's batch in inference mode."""
        _, feed = self.step(k, rows, global_batch)
        feed[self.inputs[2]] = False
        return self.fetches["loss"], feed


def build(dtype: str = "float64") -> Program:
    dtype = tf.as_dtype(dtype)
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf1.train.get_or_create_global_step()
        x = tf1.placeholder(dtype, [None, FEATURES], name="x")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        is_training = tf1.placeholder_with_default(False, [], name="is_training")
        init = tf1.glorot_uniform_initializer(seed=9)
        h = tf1.layers.dense(x, HIDDEN, kernel_initializer=init)
        h = tf.nn.relu(tf1.layers.batch_normalization(h, training=is_training))
        h = tf1.layers.dense(h, HIDDEN, kernel_initializer=init)
        h = tf.nn.relu(tf1.layers.batch_normalization(h, training=is_training))
        logits = tf1.layers.dense(h, CLASSES, kernel_initializer=init)
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
            train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=global_step)
    return Program(graph, {"train": train, "loss": loss}, (x, labels, is_training))
