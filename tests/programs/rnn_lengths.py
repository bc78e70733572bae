"""A tf.compat.v1 recurrent classifier of token sequences of each example's
own length, as NLP programs write it: the padded tokens embedded, a
recurrence stepped by tf.compat.v1.nn.dynamic_rnn with each sequence's
length fed as its sequence_length, the final state classified. The loop
runs to the batch's longest sequence (a statistic of the batch's values:
transforms.padded_lengths makes it the global batch's), and each sequence's
state is copied through once it has ended. The cell is BasicRNNCell's step
written out (TensorFlow's cells come from legacy Keras, which the test
process does not load); dynamic_rnn drives it as it drives them.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import rnn_cell_impl   # the zero state TensorFlow's cells make

from tests.programs import FedProgram

tf1 = tf.compat.v1

VOCAB, STEPS, DIM, UNITS, CLASSES = 16, 6, 4, 5, 3


class ElmanCell:
    """tanh([x, h] W + b), with the RNNCell interface dynamic_rnn reads."""

    def __init__(self, units: int, dtype):
        self.units, self.dtype = units, dtype

    @property
    def state_size(self):
        return self.units

    @property
    def output_size(self):
        return self.units

    def zero_state(self, batch_size, dtype):
        return rnn_cell_impl._zero_state_tensors(self.units, batch_size, dtype)

    def __call__(self, x, h, scope=None):
        with tf1.variable_scope("cell", reuse=tf1.AUTO_REUSE):
            init = tf1.glorot_uniform_initializer(seed=4)
            w = tf1.get_variable("kernel", [int(x.shape[1]) + self.units, self.units],
                                 self.dtype, init)
            b = tf1.get_variable("bias", [self.units], self.dtype, tf1.zeros_initializer())
        out = tf.tanh(tf.matmul(tf.concat([x, h], 1), w) + b)
        return out, out


def _batch(k: int, batch: int) -> tuple:
    """Step k's `batch` sequences: tokens padded with 0 after each one's
    length (1 to STEPS), the lengths, a class each."""
    rng = np.random.default_rng(700 + k)
    lengths = rng.integers(1, STEPS + 1, size=batch).astype(np.int32)
    tokens = rng.integers(1, VOCAB, size=(batch, STEPS)).astype(np.int32)
    tokens[np.arange(STEPS) >= lengths[:, None]] = 0
    return tokens, lengths, rng.integers(0, CLASSES, size=batch).astype(np.int32)


def build(dtype: str = "float64") -> FedProgram:
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(9)
        global_step = tf1.train.get_or_create_global_step()
        tokens = tf1.placeholder(tf.int32, [None, STEPS], name="tokens")
        lengths = tf1.placeholder(tf.int32, [None], name="lengths")
        labels = tf1.placeholder(tf.int32, [None], name="labels")
        embedding = tf1.get_variable("embedding", [VOCAB, DIM], dtype,
                                     tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
        _, state = tf1.nn.dynamic_rnn(ElmanCell(UNITS, dtype),
                                      tf.nn.embedding_lookup(embedding, tokens),
                                      sequence_length=lengths, dtype=dtype)
        logits = tf.matmul(state, tf1.get_variable("head", [UNITS, CLASSES], dtype,
                                                   tf1.glorot_uniform_initializer(seed=5)))
        loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
        train = tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss, global_step=global_step)
    return FedProgram(graph, train, (tokens, lengths, labels), _batch)
