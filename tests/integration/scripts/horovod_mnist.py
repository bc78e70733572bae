# autopar port: horovod/horovod examples/tensorflow2/tensorflow2_mnist.py at
# 034964ac5456b5484f156cc1a37655f349c13a37, its custom training loop in autopar's form with the
# smallest change, each marked "autopar port": what Horovod's migration deletes (hvd.init, the
# GPU pinning by local rank, DistributedGradientTape, broadcast_variables on the first batch;
# docs/horovod.md); the traced step run by autopar.get_runner on each worker's shard of the
# data (autopar.shard), where --reference runs the program's own loop on one device with the
# job's global batch; hvd.size() is autopar.num_workers() (the reference takes the job's:
# --size); 200 synthetic 10x10 images in place of MNIST's, small layers, 4 steps, float64,
# fixed seeds; prints the losses, saves every variable.
# Copyright 2019 Uber Technologies, Inc. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
import sys

import argparse  # autopar port
import os  # autopar port

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))  # autopar port

import numpy as np  # noqa: E402  autopar port
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402  autopar port: float64, seeds

import autopar  # noqa: E402  autopar port: was import horovod, horovod.tensorflow as hvd

# autopar port: the program's arguments, float64, seeds
p = argparse.ArgumentParser()
p.add_argument("--reference", action="store_true", help="the program's own loop, one device")
p.add_argument("--size", type=int, default=3, help="the job's workers (with --reference)")
p.add_argument("--spec")
p.add_argument("--run-option", default="hybrid")
p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
args = p.parse_args()
keras.config.set_floatx("float64")
keras.utils.set_random_seed(0)


def train():
    # Horovod: initialize Horovod.
    # hvd.init()  # autopar port: deleted (autopar.get_runner starts the job)
    # autopar port: hvd.size() is the job's number of workers
    size = args.size if args.reference else autopar.num_workers()

    # autopar port: the GPU pinning by hvd.local_rank() deleted (each worker sees the GPUs its
    # host gives it)

    # autopar port: 200 synthetic 10x10 images in place of
    # tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())
    rng = np.random.default_rng(0)
    mnist_images = rng.integers(0, 256, size=(200, 10, 10)).astype(np.uint8)
    mnist_labels = rng.integers(0, 10, size=(200,))

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float64),  # autopar port: float64
                 tf.cast(mnist_labels, tf.int64))
    )
    # autopar port: each worker takes its shard of the shuffled examples and batches 8 of them
    # (was 128 per process), the reference the job's global batch
    if args.reference:
        dataset = dataset.repeat().shuffle(10000).batch(8 * size)
    else:
        dataset = autopar.shard(dataset.repeat().shuffle(10000)).batch(8)

    mnist_model = tf.keras.Sequential([
        tf.keras.layers.Conv2D(4, [3, 3], activation='relu'),  # autopar port: 4 filters (32)
        tf.keras.layers.Conv2D(8, [3, 3], activation='relu'),  # autopar port: 8 filters (64)
        tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation='relu'),  # autopar port: 16 units (128)
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(10, activation='softmax')
    ])
    loss = tf.losses.SparseCategoricalCrossentropy()

    # Horovod: adjust learning rate based on number of GPUs.
    opt = tf.optimizers.Adam(0.001 * size)  # autopar port: hvd.size()

    checkpoint_dir = './checkpoints'
    checkpoint = tf.train.Checkpoint(model=mnist_model, optimizer=opt)


    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = mnist_model(images, training=True)
            loss_value = loss(labels, probs)

        # Horovod: add Horovod Distributed GradientTape.
        # autopar port: deleted (tape = hvd.DistributedGradientTape(tape))

        grads = tape.gradient(loss_value, mnist_model.trainable_variables)
        opt.apply_gradients(zip(grads, mnist_model.trainable_variables))

        # autopar port: the broadcast of the first batch deleted (autopar starts every worker
        # from the chief's values, the optimizer's slots too)

        return loss_value

    # autopar port: the step traced once and run by autopar on every worker of --spec
    if not args.reference:
        runner = autopar.get_runner(training_step.get_concrete_function(
            tf.TensorSpec([None, 10, 10, 1], tf.float64), tf.TensorSpec([None], tf.int64),
            False), args.spec, autopar.Config(log_every_steps=0, run_option=args.run_option))
        training_step = lambda images, labels, first_batch: runner.call(images, labels)  # noqa

    # Horovod: adjust number of steps based on number of GPUs.
    # autopar port: 4 steps (10000 // hvd.size())
    for batch, (images, labels) in enumerate(dataset.take(4)):
        loss_value = training_step(images, labels, batch == 0)

        # autopar port: the hvd.local_rank() == 0 guard deleted; every step's loss
        if batch % 1 == 0:
            print('Step #%d\tLoss: %.6f' % (batch, loss_value))

    # autopar port: the Keras objects hold the trained values once the runner closes
    if not args.reference:
        runner.close()

    # Horovod: save checkpoints only on worker 0 to prevent other workers from
    # corrupting it.
    # autopar port: the chief is worker 0 (hvd.rank() == 0); every worker's variables saved
    worker = 0 if args.reference else runner.worker_index
    np.savez(args.out.format(worker=worker),
             **{v.path: v.numpy() for v in mnist_model.variables + opt.variables})
    if worker == 0:
        checkpoint.save(checkpoint_dir)
        return mnist_model


if __name__ == '__main__':
    # autopar port: horovod.run's branch deleted (autopar.get_runner starts the job)
    train()
