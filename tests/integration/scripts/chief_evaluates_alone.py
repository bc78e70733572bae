"""A TensorFlow 1 loop whose chief alone evaluates between training steps
(runner.run of a prediction, no train op), as TF1 scripts print a
validation figure: sequences of a length the graph leaves unknown (so
every training step checks the workers' lengths), averaged over their
positions, then a linear layer; with --dropout a dropout on the inputs (a
draw per example). 4 steps of a global batch of 6, each worker feeding
its rows w, w+N, ...; one device (no --spec) runs the same loop. Saves the
variables to --out ({worker} replaced)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402

tf1 = tf.compat.v1
p = argparse.ArgumentParser()
p.add_argument("--spec")
p.add_argument("--dropout", action="store_true")
p.add_argument("--out", required=True)
args = p.parse_args()
tf1.disable_v2_behavior()
tf1.set_random_seed(3)
x = tf1.placeholder(tf.float64, [None, None, 2], name="x")
y = tf1.placeholder(tf.float64, [None], name="y")
inputs = tf1.nn.dropout(x, rate=0.25) if args.dropout else x
w = tf1.get_variable("w", [2, 1], tf.float64, tf1.ones_initializer())
prediction = tf.squeeze(tf.matmul(tf.reduce_mean(inputs, axis=1), w), 1)
loss = tf.reduce_mean((prediction - y) ** 2)
train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
rng = np.random.default_rng(0)
batches = [(rng.normal(size=(6, 3 + step, 2)), rng.normal(size=6)) for step in range(4)]
held_out = rng.normal(size=(2, 5, 2))
with autopar.get_runner(tf1.get_default_graph(), args.spec,
                        autopar.Config(log_every_steps=0)) as runner:
    mine = slice(runner.worker_index, None, runner.num_workers)
    for step, (xb, yb) in enumerate(batches):
        runner.run(train, {x: xb[mine], y: yb[mine]})
        if step == 1 and runner.is_chief:
            print("held-out prediction", runner.run(prediction, {x: held_out}), flush=True)
    values = runner.run({"w": w})
np.savez(args.out.format(worker=runner.worker_index), **values)
