"""Train a TF1 model on every batch of a finite tf.data pipeline
(autopar.shard, then .batch(b), for --epochs), until the iterator ends (or
for --steps), and save every global variable (weights, Adam's slots, the
global step).

    tfdata_epochs.py --out OUT --batch B [--steps K] [--spec SPEC --run-option R]

One device with --batch N*b reads, step by step, the examples N workers
with batch b read together (element i goes to worker i mod N), the last
batch of each epoch too: --examples leaves it smaller than the others, and
N workers split it unevenly (23 examples, b = 2, N = 3: a last step of
2/2/1)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402
from tests.integration.scripts.v1_behavior import behave_as_tf1  # noqa: E402

tf1 = tf.compat.v1
VOCAB, IDS, CLASSES = 20, 3, 3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--batch", type=int, required=True, help="per-worker batch")
    p.add_argument("--examples", type=int, default=23)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--steps", type=int,
                   help="run this many steps, not until the iterator ends: a run that ends "
                        "it may also run Adam's decay of a sparse gradient's m, which reads "
                        "no gradient, or not, by chance (TensorFlow on one device)")
    p.add_argument("--v1-behavior", action="store_true",
                   help="call tf.compat.v1.disable_v2_behavior() first, as TF1-era scripts do")
    p.add_argument("--resource-variables", action="store_true",
                   help="with --v1-behavior: the one-device reference (v1_behavior.py)")
    args = p.parse_args()
    if args.v1_behavior:
        behave_as_tf1(args.resource_variables)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(args.examples, IDS)).astype(np.int64)
    dense = rng.normal(size=(args.examples, 4))
    labels = rng.integers(0, CLASSES, size=args.examples).astype(np.int64)
    graph = tf.Graph()
    with graph.as_default():
        ds = autopar.shard(tf.data.Dataset.from_tensor_slices((ids, dense, labels)))
        x_ids, x, y = tf1.data.make_one_shot_iterator(
            ds.batch(args.batch).repeat(args.epochs)).get_next()
        emb = tf1.get_variable("emb", [VOCAB, 5], tf.float64,
                               tf1.random_normal_initializer(seed=1))
        w1 = tf1.get_variable("w1", [9, 8], tf.float64, tf1.glorot_uniform_initializer(seed=2))
        w2 = tf1.get_variable("w2", [8, CLASSES], tf.float64,
                              tf1.glorot_uniform_initializer(seed=3))
        features = tf.concat([tf.reduce_mean(tf.nn.embedding_lookup(emb, x_ids), 1), x], 1)
        logits = tf.matmul(tf.nn.relu(tf.matmul(features, w1)), w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        gs = tf1.train.get_or_create_global_step()
        train = tf1.train.AdamOptimizer(0.05).minimize(loss, global_step=gs)
        variables = tf1.global_variables()
    config = autopar.Config(run_option=args.run_option, log_every_steps=1)
    with autopar.get_runner(graph, args.spec, config) as runner:
        steps = 0
        while args.steps is None or steps < args.steps:
            try:
                runner.run(train)
            except tf.errors.OutOfRangeError:
                break
            steps += 1
        values = runner.run({v.op.name: v for v in variables})
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"worker{runner.worker_index}.npz"), **values)
        print(f"worker {runner.worker_index} done at global step {int(values['global_step'])}",
              flush=True)


if __name__ == "__main__":
    main()
