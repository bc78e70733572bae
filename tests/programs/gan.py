"""A tf.compat.v1 GAN as such programs are written: a generator and a
discriminator with batch normalisation, each trained by its own optimizer
(Adam, Momentum) on its own loss (`minimize(..., var_list=...)`), the two train ops run on
alternate steps, a discriminator step fed real examples and noise, a
generator step fed only noise; one step runs both.

The discriminator is called twice, on the real batch and on the generated
one; its second call's batch-norm layers are differentiated by both
backward passes (the discriminator's loss reaches its weights through
them, the generator's loss reaches the generator through them), so with
Config(batch_norm_group="all") each pass must take the statistics'
gradient over every worker on its own: a step that runs one train op runs
only that pass. The discriminator's first layer normalises with
tf.nn.fused_batch_norm (float32 inside, as the fused kernel computes), its
second and the generator's with tf.nn.moments.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

NOISE, FEATURES, HIDDEN = 4, 6, 8
# What trains at each step: the discriminator, the generator, or both.
SCHEDULE = ("d", "g", "d", "g", "both", "d")


@dataclass
class Program:
    graph: tf.Graph
    fetches: dict
    inputs: tuple
    config: dict = field(default_factory=lambda: {"batch_norm_group": "all"})

    def step(self, k: int, rows: slice, global_batch: int):
        """(fetch, feed) of schedule step k for the rows `rows` of its global batch."""
        rng = np.random.default_rng(800 + k)
        real = rng.normal(size=(global_batch, FEATURES))
        noise = rng.normal(size=(global_batch, NOISE))
        kind = SCHEDULE[k % len(SCHEDULE)]
        feed = {self.inputs[1]: noise[rows]}
        if kind != "g":
            feed[self.inputs[0]] = real[rows]
        return self.fetches[kind], feed


def _batch_norm(h: tf.Tensor, name: str, fused: bool) -> tf.Tensor:
    with tf1.variable_scope(name):
        channels = int(h.shape[-1])
        gamma = tf1.get_variable("gamma", [channels], h.dtype, tf1.ones_initializer())
        beta = tf1.get_variable("beta", [channels], h.dtype, tf1.zeros_initializer())
        if fused:
            y, _, _ = tf1.nn.fused_batch_norm(
                tf.cast(tf.reshape(h, [-1, 1, 1, channels]), tf.float32),
                tf.cast(gamma, tf.float32), tf.cast(beta, tf.float32), is_training=True)
            return tf.cast(tf.reshape(y, [-1, channels]), h.dtype)
        mean, variance = tf.nn.moments(h, [0])
        return tf.nn.batch_normalization(h, mean, variance, beta, gamma, 1e-3)


def build(dtype: str = "float64") -> Program:
    dtype = tf.as_dtype(dtype)
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf1.train.get_or_create_global_step()
        real = tf1.placeholder(dtype, [None, FEATURES], name="real")
        noise = tf1.placeholder(dtype, [None, NOISE], name="noise")
        init = tf1.glorot_uniform_initializer(seed=5)

        def generator(z):
            with tf1.variable_scope("generator", initializer=init):
                h = tf.matmul(z, tf1.get_variable("w1", [NOISE, HIDDEN], dtype))
                h = tf.nn.relu(_batch_norm(h, "bn", fused=False))
                return tf.matmul(h, tf1.get_variable("w2", [HIDDEN, FEATURES], dtype))

        def discriminator(v):
            with tf1.variable_scope("discriminator", reuse=tf1.AUTO_REUSE, initializer=init):
                h = tf.matmul(v, tf1.get_variable("w1", [FEATURES, HIDDEN], dtype))
                h = tf.nn.leaky_relu(_batch_norm(h, "bn1", fused=True))
                h = tf.matmul(h, tf1.get_variable("w2", [HIDDEN, HIDDEN], dtype))
                h = tf.nn.leaky_relu(_batch_norm(h, "bn2", fused=False))
                return tf.matmul(h, tf1.get_variable("w3", [HIDDEN, 1], dtype))

        fake = generator(noise)
        real_logits, fake_logits = discriminator(real), discriminator(fake)
        xent = tf.nn.sigmoid_cross_entropy_with_logits
        d_loss = (tf.reduce_mean(xent(labels=tf.ones_like(real_logits), logits=real_logits))
                  + tf.reduce_mean(xent(labels=tf.zeros_like(fake_logits), logits=fake_logits)))
        g_loss = tf.reduce_mean(xent(labels=tf.ones_like(fake_logits), logits=fake_logits))
        d_vars = tf1.trainable_variables("discriminator")
        g_vars = tf1.trainable_variables("generator")
        # Momentum for the discriminator: its fused layer computes in float32,
        # whose summation-order differences Adam's division by sqrt(v) would
        # magnify; the generator's gradients pass it too, but mostly its own
        # float64 layers decide them.
        train_d = tf1.train.MomentumOptimizer(0.05, 0.9, name="MomentumD").minimize(
            d_loss, var_list=d_vars, global_step=global_step)
        train_g = tf1.train.AdamOptimizer(0.01, name="AdamG").minimize(g_loss, var_list=g_vars)
    return Program(graph, {"d": train_d, "g": train_g, "both": [train_d, train_g]},
                   (real, noise))
