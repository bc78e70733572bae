"""A tf.compat.v1 program with two optimizers over different variables, run
on alternate steps, written as users write such programs:

- trainer A, built with model and optimizer inside variable_scope("model")
  (as Parallax's lm1b example does, so TensorFlow names the slots
  "model/model/..."): a user-partitioned embedding (fixed_size_partitioner)
  and a dense head, Adagrad, incrementing the global step;
- trainer B: a resource embedding autopar is asked to partition
  (Config(partitions=...)) under an ExponentialMovingAverage of every B
  variable, a legacy reference-variable (VariableV2) embedding autopar is
  also asked to partition, and a dense layer; Adam in float64 (Momentum in
  float32, whose gradients herring carries), incrementing the global step.

Each trainer reads only its own inputs, so a step of one is fed only that
trainer's placeholders. The schedule also runs both at once, as a list of
two fetches and as one tf.group.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

VOCAB_A, VOCAB_B, DIM, CLASSES, FEATURES, IDS = 24, 30, 4, 3, 5, 3
# What trains at each step: "a", "b", "list" ([train_a, train_b]) or "group".
SCHEDULE = ("a", "b", "a", "b", "list", "group")
PARTITIONS = {"b/emb": 2, "b/ref_emb": 2}


@dataclass
class Program:
    graph: tf.Graph
    global_step: tf.Variable
    fetches: dict
    inputs_a: tuple
    inputs_b: tuple
    config: dict = field(default_factory=dict)

    def step(self, k: int, rows: slice, global_batch: int):
        """(fetch, feed_dict) of schedule step k for the examples `rows` of
        that step's global batch."""
        kind = SCHEDULE[k % len(SCHEDULE)]
        a, b = batches(k, global_batch)
        feed = {}
        if kind != "b":
            feed.update({t: v[rows] for t, v in zip(self.inputs_a, a)})
        if kind != "a":
            feed.update({t: v[rows] for t, v in zip(self.inputs_b, b)})
        return self.fetches[kind], feed


def batches(k: int, batch: int):
    rng = np.random.default_rng(500 + k)
    a = (rng.integers(0, VOCAB_A, size=(batch, IDS)).astype(np.int32),
         rng.integers(0, CLASSES, size=batch).astype(np.int32))
    b = (rng.integers(0, VOCAB_B, size=(batch, IDS)).astype(np.int32),
         rng.normal(size=(batch, FEATURES)),
         rng.normal(size=(batch, 1)))
    return a, b


def build(dtype: str = "float64") -> Program:
    dtype = tf.as_dtype(dtype)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        gs = tf1.train.get_or_create_global_step()
        ids_a = tf1.placeholder(tf.int32, [None, IDS], name="ids_a")
        y_a = tf1.placeholder(tf.int32, [None], name="y_a")
        ids_b = tf1.placeholder(tf.int32, [None, IDS], name="ids_b")
        x_b = tf1.placeholder(dtype, [None, FEATURES], name="x_b")
        y_b = tf1.placeholder(dtype, [None, 1], name="y_b")

        with tf1.variable_scope("model"):
            with tf1.variable_scope("lm", partitioner=tf1.fixed_size_partitioner(2)):
                emb = tf1.get_variable("emb", [VOCAB_A, DIM], dtype,
                                       tf1.random_uniform_initializer(-0.5, 0.5, seed=1))
            head = tf1.get_variable("lm/head", [DIM, CLASSES], dtype,
                                    tf1.glorot_uniform_initializer(seed=2))
            h = tf.reduce_mean(tf.nn.embedding_lookup(emb, ids_a), axis=1)
            loss_a = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=y_a, logits=tf.matmul(h, head)))
            train_a = tf1.train.AdagradOptimizer(0.3).minimize(loss_a, global_step=gs)

        with tf1.variable_scope("b"):
            emb_b = tf1.get_variable("emb", [VOCAB_B, DIM], dtype,
                                     tf1.random_uniform_initializer(-0.5, 0.5, seed=3))
            ref = tf1.get_variable("ref_emb", [VOCAB_B, DIM], dtype,
                                   tf1.random_uniform_initializer(-0.5, 0.5, seed=4),
                                   use_resource=False)
            w = tf1.get_variable("w", [FEATURES + 2 * DIM, 1], dtype,
                                 tf1.glorot_uniform_initializer(seed=5))
            h = tf.concat([x_b, tf.reduce_mean(tf.nn.embedding_lookup(emb_b, ids_b), axis=1),
                           tf.reduce_sum(tf.nn.embedding_lookup(ref, ids_b), axis=1)], axis=1)
            loss_b = tf.reduce_mean(tf.square(tf.matmul(h, w) - y_b))
        opt_b = (tf1.train.AdamOptimizer(0.02, name="AdamB") if dtype == tf.float64
                 else tf1.train.MomentumOptimizer(0.05, 0.9, name="MomentumB"))
        minimize_b = opt_b.minimize(loss_b, global_step=gs)
        ema = tf1.train.ExponentialMovingAverage(0.9)
        with tf.control_dependencies([minimize_b]):
            train_b = ema.apply([emb_b, ref, w])
        both = tf.group(train_a, train_b, name="train_both")
    return Program(graph, gs, {"a": train_a, "b": train_b, "list": [train_a, train_b],
                               "group": both},
                   (ids_a, y_a), (ids_b, x_b, y_b), {"partitions": dict(PARTITIONS)})
