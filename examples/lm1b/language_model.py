# Copyright (c) 2016 Rafal Jozefowicz; modified by Seoul National University
# for Parallax (github.com/snuspl/parallax, parallax/examples/lm1b). MIT
# License: see LICENSE in this directory.
#
# Ported to TensorFlow 2.21's tf.compat.v1 and autopar; every change is
# marked "autopar port":
# - tf.flags -> tf.compat.v1.flags, tf.X -> tf.compat.v1.X where TF 2 moved it;
# - parallax.get_partitioner(n) -> tf.compat.v1.fixed_size_partitioner(n);
# - the model sizes, the dropout keep probability and the sampled softmax's
#   sample count are flags (defaults: the original values) so that a test can
#   build a small, deterministic model (keep_prob 1, full softmax).
from __future__ import absolute_import
from __future__ import division
from __future__ import print_function

import functools

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import ops
from tensorflow.python.framework import tensor_shape
from tensorflow.python.layers import base

tf1 = tf.compat.v1  # autopar port

FLAGS = tf1.flags.FLAGS  # autopar port
tf1.flags.DEFINE_integer('num_variable_shards', 32, 'Number of variable shard')
# autopar port: the sizes below were constants of LM.__init__.
tf1.flags.DEFINE_integer('vocab_size', 793470, 'Vocabulary size')
tf1.flags.DEFINE_integer('emb_size', 512, 'Embedding size')
tf1.flags.DEFINE_integer('state_size', 2048, 'LSTM state size')
tf1.flags.DEFINE_integer('projected_size', 512, 'LSTM projection size')
tf1.flags.DEFINE_float('keep_prob', 0.9, 'Dropout keep probability in training')
tf1.flags.DEFINE_integer('num_sampled', 8192, 'Sampled softmax samples (0: full softmax)')

class LM(base.Layer):
  def __init__(self, num_steps):
    super(LM, self).__init__()
    self.num_steps = num_steps
    self.num_shards = FLAGS.num_variable_shards
    # Use keep_prob 1.0 at evaluation
    self.keep_prob = FLAGS.keep_prob  # autopar port

    self.vocab_size = FLAGS.vocab_size  # autopar port
    self.emb_size = FLAGS.emb_size  # autopar port
    self.state_size = FLAGS.state_size  # autopar port
    self.projected_size = FLAGS.projected_size  # autopar port
    # Use num_sampled 0 (full softmax) at evaluation
    self.num_sampled = FLAGS.num_sampled  # autopar port

  def build(self, input_shape):
    partitioner = tf1.fixed_size_partitioner(self.num_shards)  # autopar port
    with tf1.variable_scope(tf1.get_variable_scope(), partitioner=partitioner):
      self.emb = tf1.get_variable('emb',
                                  shape=[self.vocab_size, self.emb_size],
                                  initializer=tf1.uniform_unit_scaling_initializer(),
                                  trainable=True,
                                  dtype=tf.float32)
      self.softmax_w = tf1.get_variable(name='softmax_w',
                                        shape=[self.vocab_size, self.projected_size],
                                        initializer=tf1.uniform_unit_scaling_initializer(),
                                        trainable=True,
                                        dtype=tf.float32)

    self.softmax_b = self.add_variable(name='softmax_b',
                                       shape=[self.vocab_size],
                                       trainable=True,
                                       dtype=tf.float32)
    self.W = self.add_variable(name='W',
                               shape=[self.emb_size + self.projected_size, 4 * self.state_size],
                               trainable=True,
                               dtype=tf.float32)
    self.B = self.add_variable(name='B',
                               shape=[4 * self.state_size],
                               trainable=True,
                               dtype=tf.float32)
    self.W_P = self.add_variable(name='W_P',
                                 shape=[self.state_size, self.projected_size],
                                 trainable=True,
                                 dtype=tf.float32)
    self.built = True

  def call(self, x, y, w, initial_state_c, initial_state_h, training):
    # [bs, steps, emb_size]
    x = tf.nn.embedding_lookup(self.emb, x)
    if training:
      x = tf1.nn.dropout(x, self.keep_prob)  # autopar port

    # [bs, emb_size] * steps
    inputs = [tf.squeeze(v, axis=[1]) for v in tf.split(value=x, num_or_size_splits=self.num_steps, axis=1)]

    c = initial_state_c
    h = initial_state_h
    for t in range(self.num_steps):
      # i = input_gate, j = new_input, f = forget_gate, o = output_gate
      cell_inputs = tf.concat([inputs[t], h], axis=1)
      lstm_matrix = tf1.nn.xw_plus_b(cell_inputs, self.W, self.B)  # autopar port
      i, j, f, o = tf.split(lstm_matrix, 4, axis=1)

      c = tf.sigmoid(f + 1.0) * c + tf.sigmoid(i) * tf.tanh(j)
      h = tf.sigmoid(o) * tf.tanh(c)
      h = tf.matmul(h, self.W_P)
      inputs[t] = h
      if training:
        inputs[t] = tf1.nn.dropout(inputs[t], self.keep_prob)  # autopar port

    inputs[t] = tf.identity(inputs[t])

    inputs = tf.reshape(tf.concat(inputs, axis=1), [-1, self.projected_size])

    if training and self.num_sampled:  # autopar port: 0 samples means the full softmax
      targets = tf.reshape(y, [-1, 1])
      loss = tf.nn.sampled_softmax_loss(self.softmax_w,
                                        self.softmax_b,
                                        targets,
                                        inputs,
                                        self.num_sampled,
                                        self.vocab_size)
    else:
      full_softmax_w = tf.reshape(tf.concat(self.softmax_w, axis=1), [-1, self.projected_size])
      full_softmax_w = full_softmax_w[:self.vocab_size, :]

      logits = tf.matmul(inputs, full_softmax_w, transpose_b=True) + self.softmax_b
      targets = tf.reshape(y, [-1])
      loss = tf.nn.sparse_softmax_cross_entropy_with_logits(logits=logits, labels=targets)

    loss = tf.reduce_mean(loss * tf.reshape(tf.cast(w, tf.float32), [-1]))  # autopar port
    return loss, c, h
