"""Throughput of a small ResNet-style CNN on synthetic CIFAR-shaped data
(32x32x3, 10 classes): a plain single-device tf.compat.v1 training script, plus
the two lines marked "autopar" that make it train on every worker of a cluster.

    python examples/cnn.py                                           # one device
    python examples/cnn.py --spec resource_specs/localhost_2workers.yaml --width 2

--batch-size is per worker; images/s counts every worker's images.
"""
import argparse
import time

import autopar  # autopar: first, so TensorFlow starts quiet
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def synthetic_cifar(n=2048, classes=10, seed=0):
    """Noise plus a fixed per-class pattern, so the loss can actually go down."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    patterns = rng.normal(size=(classes, 32, 32, 3))
    images = rng.normal(size=(n, 32, 32, 3)) + patterns[labels]
    return images.astype(np.float32), labels.astype(np.int64)


def conv(x, name, channels, stride=1):
    w = tf1.get_variable(name, [3, 3, x.shape[-1], channels],
                         initializer=tf1.variance_scaling_initializer(2.0))
    return tf.nn.conv2d(x, w, strides=stride, padding="SAME")


def residual_block(x, name, channels, stride=1):
    """relu(x + conv(relu(conv(x)))); a strided 3x3 conv on the shortcut when
    the shape changes. No batch norm."""
    with tf1.variable_scope(name):
        y = conv(tf.nn.relu(conv(x, "conv1", channels, stride)), "conv2", channels)
        shortcut = x if stride == 1 and x.shape[-1] == channels else conv(x, "shortcut", channels, stride)
        return tf.nn.relu(y + shortcut)


def resnet(x, width=1, classes=10):
    x = tf.nn.relu(conv(x, "stem", 16 * width))                     # 32x32
    x = residual_block(x, "block1", 16 * width)
    x = residual_block(x, "block2", 32 * width, stride=2)           # 16x16
    x = residual_block(x, "block3", 64 * width, stride=2)           # 8x8
    x = tf.reduce_mean(x, axis=[1, 2])
    w = tf1.get_variable("fc/w", [x.shape[-1], classes], initializer=tf1.glorot_uniform_initializer())
    b = tf1.get_variable("fc/b", [classes], initializer=tf1.zeros_initializer())
    return tf.matmul(x, w) + b


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", help="resource spec (YAML); omit to train on this device only")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=32, help="images per worker per step")
    p.add_argument("--width", type=int, default=1, help="channel multiplier (model size)")
    args = p.parse_args()
    if args.steps < 1:
        p.error("--steps must be at least 1")
    tf1.disable_eager_execution()  # a tf.compat.v1 graph-mode script

    images, labels = synthetic_cifar()
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ds = tf.data.Dataset.from_tensor_slices((images, labels)).shuffle(len(images), seed=0)
        ds = autopar.shard(ds)  # autopar: this worker's disjoint slice of the data
        ds = ds.batch(args.batch_size, drop_remainder=True).repeat().prefetch(2)
        x, y = tf1.data.make_one_shot_iterator(ds).get_next()

        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=resnet(x, args.width)))
        global_step = tf1.train.get_or_create_global_step()
        train_op = tf1.train.MomentumOptimizer(0.01, 0.9).minimize(loss, global_step=global_step)

    warmup = min(10, args.steps // 2)
    config = autopar.Config(total_steps=args.steps, log_every_steps=10)
    # autopar: a session-like runner; single-device when --spec is omitted
    with autopar.get_runner(graph, args.spec, config) as runner:
        for step in range(args.steps):
            if step == warmup:
                start = time.perf_counter()
            runner.run(train_op)
        elapsed = time.perf_counter() - start
        if runner.is_chief:
            images_done = (args.steps - warmup) * args.batch_size * runner.num_workers
            print(f"{runner.num_workers} worker{'s' * (runner.num_workers != 1)}, global batch {args.batch_size * runner.num_workers}, "
                  f"width {args.width}: {images_done / elapsed:.1f} images/s "
                  f"over {args.steps - warmup} steps after {warmup} warm-up steps", flush=True)


if __name__ == "__main__":
    main()
