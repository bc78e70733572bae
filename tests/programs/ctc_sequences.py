"""A tf.compat.v1 sequence model trained with connectionist temporal
classification, as speech and handwriting recognisers are written: frames
[batch, time, features] through a dense layer and a recurrence-free
projection to logits over the classes, each sequence's labels padded with
0 and made a SparseTensor by tf.sparse.from_dense, each sequence's own
count of frames fed beside it. Two CTC losses of the same logits, averaged
over the batch: TensorFlow 1's tf.compat.v1.nn.ctc_loss (time-major
logits, the blank the last class) and TensorFlow 2's tf.nn.ctc_loss of
sparse labels with the blank 0 (its function rotates the classes and
shifts the labels' values; TensorFlow builds its cuDNN implementation
beside it, whose CTCLossV2 op is float32 alone). Momentum, which does not divide by sqrt(v), keeps
float32 summation differences at float32 tolerance.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.programs import FedProgram

tf1 = tf.compat.v1

FRAMES, FEATURES, CLASSES, LABELS = 7, 4, 5, 3


def _batch(k: int, batch: int) -> tuple:
    """Step k's `batch` sequences: frames, 1 to LABELS labels in
    [1, CLASSES - 2] padded with 0, and each sequence's count of frames (at
    least twice its labels')."""
    rng = np.random.default_rng(900 + k)
    frames = rng.normal(size=(batch, FRAMES, FEATURES)).astype(np.float32)
    labels = rng.integers(1, CLASSES - 1, size=(batch, LABELS)).astype(np.int32)
    labels[np.arange(LABELS) >= rng.integers(1, LABELS + 1, size=(batch, 1))] = 0
    return frames, labels, rng.integers(2 * LABELS, FRAMES + 1, size=batch).astype(np.int32)


def build(dtype: str = "float32") -> FedProgram:
    if dtype != "float32":
        raise ValueError("the CTC program is float32: TensorFlow's CTCLossV2 kernel is")
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(8)
        global_step = tf1.train.get_or_create_global_step()
        frames = tf1.placeholder(dtype, [None, FRAMES, FEATURES], name="frames")
        labels = tf1.placeholder(tf.int32, [None, LABELS], name="labels")
        lengths = tf1.placeholder(tf.int32, [None], name="lengths")
        init = tf1.random_normal_initializer(0, 0.5, seed=5)
        hidden = tf.tanh(tf.tensordot(frames, tf1.get_variable("w1", [FEATURES, 6], dtype, init),
                                      1) + tf1.get_variable("b1", [6], dtype, init))
        logits = tf.tensordot(hidden, tf1.get_variable("w2", [6, CLASSES], dtype, init), 1)
        sparse_labels = tf.sparse.from_dense(labels)
        blank_last = tf1.nn.ctc_loss(sparse_labels, tf.transpose(logits, [1, 0, 2]), lengths)
        blank_first = tf.nn.ctc_loss(sparse_labels, logits, None, lengths,
                                     logits_time_major=False, blank_index=0)
        loss = tf.reduce_mean(blank_last) + tf.reduce_mean(blank_first)
        train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=global_step)
    return FedProgram(graph, train, (frames, labels, lengths), _batch)
