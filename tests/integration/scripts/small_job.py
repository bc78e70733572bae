"""A tiny training job for output and error handling tests.

Prints "ready", waits until the file --go exists (so a test can close the
output pipe first), then trains --steps steps logging every step. With
--unsupported-in-worker, worker processes build a graph autopar cannot
distribute (a hand-written update) while the launcher sees a supported one:
the error is raised inside the workers.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402
from _common import ROLE, write_pid  # noqa: E402

tf1 = tf.compat.v1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec")
    p.add_argument("--go")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--unsupported-in-worker", action="store_true")
    args = p.parse_args()
    write_pid()
    print("ready", flush=True)
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        w = tf1.get_variable("w", [4, 2], initializer=tf1.ones_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)), name="loss")
        if args.unsupported_in_worker and ROLE == "worker":
            gw, = tf.gradients(loss, [w])
            train = w.assign_sub(0.01 * gw).op
        else:
            train = tf1.train.GradientDescentOptimizer(0.01).minimize(loss)
    with autopar.get_runner(graph, args.spec, autopar.Config(log_every_steps=1)) as runner:
        while args.go and not os.path.exists(args.go):
            time.sleep(0.05)
        for _ in range(args.steps):
            runner.run(train, {x: np.ones([2, 4], np.float32)})


if __name__ == "__main__":
    main()
