"""Train a small model fed through a sparse placeholder (the gradient of its
weights flows through sparse_dense_matmul) for a few steps, single-device or
under autopar with --spec, and save every global variable of this worker.
Worker i of N feeds rows [i*B/N, (i+1)*B/N) of each step's global batch,
and every worker feeds the learning rate, a constant, a value of its step."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402

tf1 = tf.compat.v1
FEATURES, CLASSES = 10, 3


def global_batch(step: int, batch: int):
    """Rows with a different number of non-zeros each (0 to 4)."""
    rng = np.random.default_rng(100 + step)
    rows = [np.sort(rng.choice(FEATURES, size=rng.integers(0, 5), replace=False))
            for _ in range(batch)]
    values = [rng.normal(size=len(r)).astype(np.float32) for r in rows]
    labels = rng.integers(0, CLASSES, size=batch).astype(np.int32)
    return rows, values, labels


def sparse_value(rows, values):
    indices = [[i, c] for i, r in enumerate(rows) for c in r]
    return tf1.SparseTensorValue(np.array(indices, np.int64).reshape(-1, 2),
                                 np.concatenate(values + [np.zeros(0, np.float32)]),
                                 [len(rows), FEATURES])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec")
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--run-option", default="hybrid")
    args = p.parse_args()
    graph = tf.Graph()
    with graph.as_default():
        gs = tf1.train.get_or_create_global_step()
        sp = tf1.sparse_placeholder(tf.float32, [None, FEATURES], name="features")
        y = tf1.placeholder(tf.int32, [None], name="y")
        w = tf1.get_variable("w", [FEATURES, CLASSES],
                             initializer=tf1.glorot_uniform_initializer(seed=4))
        b = tf1.get_variable("b", [CLASSES], initializer=tf1.constant_initializer(0.1))
        logits = tf.sparse.sparse_dense_matmul(sp, w) + b
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        # a constant fed each step (a decay written by feeding it)
        rate = tf.constant(0.5, name="learning_rate")
        train = tf1.train.MomentumOptimizer(rate, 0.9).minimize(loss, global_step=gs)
    with autopar.get_runner(graph, args.spec, autopar.Config(run_option=args.run_option)) as runner:
        n, i = runner.num_workers, runner.worker_index
        per = args.batch // n
        for step in range(args.steps):
            rows, values, labels = global_batch(step, args.batch)
            mine = slice(i * per, (i + 1) * per)
            runner.run(train, {sp: sparse_value(rows[mine], values[mine]), y: labels[mine],
                               rate: 0.5 / (step + 1)})
        with graph.as_default():
            variables = tf1.global_variables()
        saved = runner.run({v.op.name: v for v in variables})
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"worker{i}.npz"), **saved)
        print(f"worker {i} done at global step {int(saved['global_step'])}", flush=True)


if __name__ == "__main__":
    main()
