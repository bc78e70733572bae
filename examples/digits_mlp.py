"""A small MLP on scikit-learn's bundled handwritten digits (8x8 images, 10
classes): a plain single-device tf.compat.v1 training script, plus the two
lines marked "autopar" that make it train on every worker of a cluster.

    python examples/digits_mlp.py                                    # one device
    python examples/digits_mlp.py --spec resource_specs/localhost_2workers.yaml

--batch-size is per worker: N workers train with a global batch N times as large.

DropCompute (docs/dropcompute.md): --micro-batches M
makes a step M batches of --batch-size per worker; --compute-threshold auto
lets slow workers drop micro-batches; --compensation steps adds the steps that
make up the dropped samples; --delay S adds the simulated log-normal delay
(median S seconds) after every micro-batch, a benchmarking aid.

    python examples/digits_mlp.py --spec resource_specs/localhost_2workers.yaml \
        --micro-batches 4 --compute-threshold auto --compensation steps --delay 0.01
"""
import argparse
import time

import autopar  # autopar: first, so TensorFlow starts quiet
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler


tf1 = tf.compat.v1


def load_data():
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=0.2, random_state=0, stratify=digits.target)
    scaler = StandardScaler().fit(x_train)
    return (scaler.transform(x_train).astype(np.float32), y_train.astype(np.int64),
            scaler.transform(x_test).astype(np.float32), y_test.astype(np.int64))


def mlp(x, hidden=128, classes=10):
    """64 -> hidden -> classes logits. Called twice (training batch, test
    placeholder); the second call reuses the first call's variables."""
    with tf1.variable_scope("mlp", reuse=tf1.AUTO_REUSE):
        w1 = tf1.get_variable("w1", [x.shape[-1], hidden], initializer=tf1.glorot_uniform_initializer())
        b1 = tf1.get_variable("b1", [hidden], initializer=tf1.zeros_initializer())
        w2 = tf1.get_variable("w2", [hidden, classes], initializer=tf1.glorot_uniform_initializer())
        b2 = tf1.get_variable("b2", [classes], initializer=tf1.zeros_initializer())
    return tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", help="resource spec (YAML); omit to train on this device only")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=32, help="examples per worker per step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--micro-batches", type=int, default=1, help="batches accumulated per step")
    p.add_argument("--compute-threshold", default=None,
                   help="seconds, or auto (DropCompute; needs --micro-batches >= 2)")
    p.add_argument("--compensation", default="none", choices=("none", "steps", "batch"))
    p.add_argument("--delay", type=float, default=0.0,
                   help="median seconds of a simulated log-normal delay per micro-batch")
    args = p.parse_args()
    tf1.disable_eager_execution()  # a tf.compat.v1 graph-mode script

    x_train, y_train, x_test, y_test = load_data()

    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        ds = ds.shuffle(len(x_train), seed=0)
        ds = autopar.shard(ds)  # autopar: this worker's disjoint slice of the data
        ds = ds.batch(args.batch_size, drop_remainder=True).repeat()
        x, y = tf1.data.make_one_shot_iterator(ds).get_next()

        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=mlp(x)))
        global_step = tf1.train.get_or_create_global_step()
        train_op = tf1.train.AdamOptimizer(args.lr).minimize(loss, global_step=global_step)

        # The test set, sharded too: each worker evaluates its slice and
        # runner.evaluate adds up the correct predictions and the counts.
        test_ds = autopar.shard(tf.data.Dataset.from_tensor_slices((x_test, y_test))).batch(64)
        x_eval, y_eval = tf1.data.make_one_shot_iterator(test_ds).get_next()
        correct = tf.cast(tf.equal(tf.argmax(mlp(x_eval), 1), y_eval), tf.float32)
        accuracy = (tf.reduce_sum(correct), tf.size(correct))   # (sum, count) per batch

    threshold = args.compute_threshold
    config = autopar.Config(
        total_steps=args.steps, log_every_steps=50, micro_batches=args.micro_batches,
        compute_threshold=None if threshold is None else threshold if threshold == "auto"
        else float(threshold),
        drop_compensation=args.compensation,
        simulated_delay=(autopar.SimulatedDelay(median_s=args.delay, sigma=1.0,
                                                max_s=20 * args.delay) if args.delay else None))
    # autopar: a session-like runner; single-device when --spec is omitted
    with autopar.get_runner(graph, args.spec, config) as runner:
        start = time.monotonic()
        for _ in range(args.steps):
            runner.run(train_op)
        # DropCompute's "steps" compensation: as many more steps as make up
        # the samples dropped (the same number on every worker).
        extra = runner.dropcompute.extra_steps(args.steps) if runner.dropcompute else 0
        for _ in range(extra):
            runner.run(train_op)
        trained_s = time.monotonic() - start
        # Every worker evaluates (its shard); all get the whole set's accuracy.
        acc = runner.evaluate({"accuracy": accuracy})["accuracy"]
        if runner.is_chief:
            print(f"training took {trained_s:.1f} s ({extra} compensation steps)")
            print(f"trained {args.steps + extra} steps on {runner.num_workers} worker{'s' * (runner.num_workers != 1)}, "
                  f"global batch {args.batch_size * runner.num_workers * runner.micro_batches}")
            print(f"test accuracy: {acc:.4f} ({len(y_test)} test examples)", flush=True)


if __name__ == "__main__":
    main()
