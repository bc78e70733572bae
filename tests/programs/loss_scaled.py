"""A tf.compat.v1 program trained with loss scaling, as mixed-precision TF1
programs are written: tf.compat.v1.mixed_precision's
MixedPrecisionLossScaleOptimizer around Momentum, a dynamic loss scale, the
global step passed to minimize(). Built in TensorFlow 2's default control
flow (v2), its tf.conds are functional If ops: the update is applied, and
the global step incremented, only when every scaled gradient is finite, and
the scale grows after `INCREMENT_PERIOD` finite steps, halves after a step
that is not. From a scale of 2**125 the scaled gradients of this model's
summed loss overflow float32 in two of the six steps of the tests (the
scale then 2**126): both branches run.

A sparse embedding (ids) and a dense layer (features) into a softmax summed
over the batch, float32 (the loss scale overflows float32; Momentum, which
does not divide by sqrt(v), keeps float32 summation differences at float32
tolerance).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.programs import FedProgram

tf1 = tf.compat.v1

VOCAB, DIM, CLASSES, FEATURES, IDS = 20, 4, 3, 5, 3
INITIAL_SCALE, INCREMENT_PERIOD = 2.0 ** 125, 2


def _batch(k: int, batch: int) -> tuple:
    """Step k's ids, features and labels, `batch` examples."""
    rng = np.random.default_rng(300 + k)
    return (rng.integers(0, VOCAB, size=(batch, IDS)).astype(np.int64),
            3.0 * rng.normal(size=(batch, FEATURES)).astype(np.float32),
            rng.integers(0, CLASSES, size=batch).astype(np.int32))


def build(dtype: str = "float32") -> FedProgram:
    if dtype != "float32":
        raise ValueError("the loss-scaled program is float32: its loss scale overflows float32")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(4)
        global_step = tf1.train.get_or_create_global_step()
        ids = tf1.placeholder(tf.int64, [None, IDS], name="ids")
        x = tf1.placeholder(tf.float32, [None, FEATURES], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        init = tf1.random_normal_initializer(0, 0.5, seed=2)
        emb = tf1.get_variable("emb", [VOCAB, DIM], tf.float32, init)
        w = tf1.get_variable("w", [DIM + FEATURES, CLASSES], tf.float32, init)
        h = tf.concat([tf.reduce_mean(tf.nn.embedding_lookup(emb, ids), 1), x], 1)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.matmul(h, w)))
        optimizer = tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(
            tf1.train.MomentumOptimizer(0.05, 0.9),
            tf1.mixed_precision.DynamicLossScale(INITIAL_SCALE, increment_period=INCREMENT_PERIOD))
        train = optimizer.minimize(loss, global_step=global_step)
    return FedProgram(graph, train, (ids, x, y), _batch)
