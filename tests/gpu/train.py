"""The training program `make gpu-check` runs (tests/gpu/check.py): an MLP
over an embedding, float64 (no TF32 in its MatMuls on any GPU), Adam with
global-norm clipping. Its last step is traced; each worker saves its
variables and the devices its MatMuls ran on in that step's trace."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402

tf1 = tf.compat.v1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=32, help="global batch")
    p.add_argument("--out", required=True, help="folder for worker{i}.npz and worker{i}.json")
    args = p.parse_args()
    tf1.disable_eager_execution()
    rng = np.random.default_rng(0)
    n = args.batch * args.steps
    ids = rng.integers(0, 100, size=(n, 4))
    x = rng.normal(size=(n, 16))
    y = rng.normal(size=(n, 1))
    graph = tf.Graph()
    with graph.as_default():
        ds = autopar.shard(tf.data.Dataset.from_tensor_slices((ids, x, y)))
        ds = ds.batch(args.batch // autopar.num_workers())
        words, features, labels = tf1.data.make_one_shot_iterator(ds).get_next()
        init = tf1.initializers.random_normal(stddev=0.2, seed=1, dtype=tf.float64)
        embedding = tf1.get_variable("embedding", [100, 8], tf.float64, init)
        w1 = tf1.get_variable("w1", [16 + 4 * 8, 64], tf.float64, init)
        w2 = tf1.get_variable("w2", [64, 1], tf.float64, init)
        looked_up = tf.reshape(tf.nn.embedding_lookup(embedding, words), [-1, 4 * 8])
        hidden = tf.nn.relu(tf.matmul(tf.concat([features, looked_up], 1), w1))
        loss = tf.reduce_mean(tf.square(tf.matmul(hidden, w2) - labels))
        step = tf1.train.get_or_create_global_step()
        optimizer = tf1.train.AdamOptimizer(0.01)
        grads, variables = zip(*optimizer.compute_gradients(loss))
        clipped, _ = tf.clip_by_global_norm(grads, 1.0)
        train = optimizer.apply_gradients(zip(clipped, variables), global_step=step)
    runner = autopar.get_runner(graph, args.spec, autopar.Config(run_option=args.run_option))
    metadata = tf1.RunMetadata()
    with runner:
        for i in range(args.steps):
            last = i == args.steps - 1
            runner.run(train, options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
                       if last else None, run_metadata=metadata if last else None)
        with graph.as_default():
            values = runner.run({v.op.name: v for v in tf1.global_variables()})
    matmuls = sorted({d.device for d in metadata.step_stats.dev_stats for node in d.node_stats
                      if node.node_name.split("/")[-1].startswith("MatMul")})
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"worker{runner.worker_index}.npz"), **values)
    with open(os.path.join(args.out, f"worker{runner.worker_index}.json"), "w") as f:
        json.dump({"matmul_devices": matmuls}, f)


if __name__ == "__main__":
    main()
