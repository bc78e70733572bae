"""A tf.compat.v1 classifier with batch normalisation as TF1-era programs
write it (the shape of tf.contrib.layers.batch_norm and of the
tf.compat.v1.layers.batch_normalization docstring): an `is_training`
placeholder that defaults to False, fed True by the training steps; the
layer's batch statistics under `tf.compat.v1.cond(is_training, ...)` (V1
control flow's Switch and Merge after disable_v2_behavior(), an If
otherwise), the moving statistics' updates put in UPDATE_OPS and run with
the train op through a control dependency; Config left at its defaults.

The first layer normalises with tf.nn.fused_batch_norm (float32 inside, as
the fused kernel computes), the second with tf.nn.moments. Between steps
every worker evaluates the loss of its own rows in inference mode (the
moving statistics), as a program logging a validation loss does: not a
training step, it must neither wait for the other workers nor change what
the next step computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

FEATURES, HIDDEN, CLASSES = 5, 8, 3
DECAY, EPSILON = 0.9, 1e-3


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
        fetch, feed = self.step(k, rows, global_batch)
        feed[self.inputs[2]] = False
        return self.fetches["loss"], feed


def batch_norm(x: tf.Tensor, is_training: tf.Tensor, name: str, fused: bool) -> tf.Tensor:
    """contrib's batch_norm in short: scale and offset, moving statistics,
    batch statistics in training, the moving ones otherwise."""
    with tf1.variable_scope(name):
        channels = int(x.shape[-1])
        gamma = tf1.get_variable("gamma", [channels], x.dtype, tf1.ones_initializer())
        beta = tf1.get_variable("beta", [channels], x.dtype, tf1.zeros_initializer())
        moving_mean = tf1.get_variable("moving_mean", [channels], x.dtype,
                                       tf1.zeros_initializer(), trainable=False)
        moving_variance = tf1.get_variable("moving_variance", [channels], x.dtype,
                                           tf1.ones_initializer(), trainable=False)

        def training():
            if fused:
                y, mean, variance = tf1.nn.fused_batch_norm(
                    tf.cast(tf.reshape(x, [-1, 1, 1, channels]), tf.float32),
                    tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32), epsilon=EPSILON,
                    is_training=True)
                return (tf.cast(tf.reshape(y, [-1, channels]), x.dtype),
                        tf.cast(mean, x.dtype), tf.cast(variance, x.dtype))
            mean, variance = tf.nn.moments(x, [0])
            return tf.nn.batch_normalization(x, mean, variance, beta, gamma, EPSILON), \
                mean, variance

        def inference():
            return (tf.nn.batch_normalization(x, moving_mean, moving_variance, beta, gamma,
                                              EPSILON), moving_mean, moving_variance)

        y, mean, variance = tf1.cond(is_training, training, inference)
        for moving, value in ((moving_mean, mean), (moving_variance, variance)):
            update = tf1.assign(moving, moving * DECAY + value * (1 - DECAY))
            tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, update)
        return y


def program_of(dtype: str, loss_of) -> Program:
    """The classifier whose loss `loss_of(x, labels, is_training, dtype)`
    builds, trained by Momentum with UPDATE_OPS run with the train op."""
    dtype = tf.as_dtype(dtype)
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf1.train.get_or_create_global_step()
        x = tf1.placeholder(dtype, [None, FEATURES], name="x")
        labels = tf1.placeholder(tf.int64, [None], name="labels")
        is_training = tf1.placeholder_with_default(False, [], name="is_training")
        loss = loss_of(x, labels, is_training, dtype)
        update_ops = tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)
        with tf.control_dependencies(update_ops):
            train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=global_step)
    return Program(graph, {"train": train, "loss": loss}, (x, labels, is_training))


def _loss(x, labels, is_training, dtype) -> tf.Tensor:
    with tf1.variable_scope("model", initializer=tf1.glorot_uniform_initializer(seed=9)):
        h = tf.matmul(x, tf1.get_variable("w1", [FEATURES, HIDDEN], dtype))
        h = tf.nn.relu(batch_norm(h, is_training, "bn1", fused=True))
        h = tf.matmul(h, tf1.get_variable("w2", [HIDDEN, HIDDEN], dtype))
        h = tf.nn.relu(batch_norm(h, is_training, "bn2", fused=False))
        logits = tf.matmul(h, tf1.get_variable("w3", [HIDDEN, CLASSES], dtype))
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=logits))


def build(dtype: str = "float64") -> Program:
    return program_of(dtype, _loss)
