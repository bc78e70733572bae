"""A user's training script, as it would sit in their own folder: a small
MLP trained with momentum on generated data, distributed by the two
autopar lines. With --save, every worker saves its global variables.

    python user_train.py --steps 6 --save single.npz                    # one device
    python user_train.py --spec spec.yaml --run-option herring --save w{worker}.npz
"""
import argparse

import numpy as np
import tensorflow as tf

import autopar

tf1 = tf.compat.v1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--spec")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=16, help="global batch")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--save")
    p.add_argument("--board", help="Config.tensorboard_dir")
    args = p.parse_args()
    tf1.disable_eager_execution()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.batch * args.steps, 8)).astype(np.float32)
    y = (x @ rng.normal(size=(8, 1)) + 0.1).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        ds = tf.data.Dataset.from_tensor_slices((x, y))
        ds = autopar.shard(ds)                                          # autopar
        ds = ds.batch(args.batch // autopar.num_workers())
        features, labels = tf1.data.make_one_shot_iterator(ds).get_next()
        init = tf1.initializers.random_normal(stddev=0.3, seed=1)
        w1 = tf1.get_variable("w1", [8, 16], initializer=init)
        b1 = tf1.get_variable("b1", [16], initializer=tf1.zeros_initializer())
        w2 = tf1.get_variable("w2", [16, 1], initializer=init)
        hidden = tf.nn.relu(features @ w1 + b1)
        loss = tf.reduce_mean(tf.square(hidden @ w2 - labels))
        step = tf1.train.get_or_create_global_step()
        train = tf1.train.MomentumOptimizer(0.05, 0.9).minimize(loss, global_step=step)
    config = autopar.Config(run_option=args.run_option, log_every_steps=1,
                            tensorboard_dir=args.board)
    runner = autopar.get_runner(graph, args.spec, config)               # autopar
    with runner:
        for _ in range(args.steps):
            runner.run(train)
        with graph.as_default():
            values = runner.run({v.op.name: v for v in tf1.global_variables()})
    if args.save:
        np.savez(args.save.format(worker=runner.worker_index), **values)


if __name__ == "__main__":
    main()
