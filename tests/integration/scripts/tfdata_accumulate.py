"""Train a small MLP from a tf.data pipeline (autopar.shard, then .batch(b)),
optionally with Config(micro_batches=M), and save the parameters.

    tfdata_accumulate.py OUT BATCH [SPEC M [unsharded]]

SPEC "-": none (under `autopar launch`); "unsharded": without autopar.shard
(refused unless Config(allow_unsharded_input=True)).

Single device with BATCH = N*M*b sees, step by step, the same examples as N
workers with batch b and M micro-batches (element i goes to worker i mod N).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import autopar  # noqa: E402

tf1 = tf.compat.v1
STEPS = 3


def main() -> None:
    out, batch = sys.argv[1], int(sys.argv[2])
    spec = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "-" else None
    micro = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    sharded = sys.argv[5:6] != ["unsharded"]
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(512, 6)).astype(np.float32)
    ys = rng.integers(0, 3, size=512).astype(np.int64)
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ds = tf.data.Dataset.from_tensor_slices((xs, ys))
        ds = autopar.shard(ds) if sharded else ds
        x, y = tf1.data.make_one_shot_iterator(ds.batch(batch).repeat()).get_next()
        w1 = tf1.get_variable("w1", [6, 8], initializer=tf1.glorot_uniform_initializer(seed=1))
        w2 = tf1.get_variable("w2", [8, 3], initializer=tf1.glorot_uniform_initializer(seed=2))
        logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y,
                                                                             logits=logits))
        gs = tf1.train.get_or_create_global_step()
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(loss, global_step=gs)
    config = autopar.Config(micro_batches=micro, log_every_steps=1)
    with autopar.get_runner(graph, spec, config) as runner:
        losses = [float(runner.run([train, loss])[1]) for _ in range(STEPS)]
        values = runner.run({"w1": w1, "w2": w2, "global_step": gs})
        os.makedirs(out, exist_ok=True)
        np.savez(os.path.join(out, f"worker{runner.worker_index}.npz"), **values)
        print(f"worker {runner.worker_index} losses {losses}", flush=True)


if __name__ == "__main__":
    main()
