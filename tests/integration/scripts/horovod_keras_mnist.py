# autopar port: horovod/horovod examples/tensorflow2/tensorflow2_keras_mnist.py at
# 034964ac5456b5484f156cc1a37655f349c13a37, written for autopar.fit with the smallest change,
# each marked "autopar port": what Horovod's migration deletes (hvd.init, the GPU pinning by
# local rank, DistributedOptimizer, BroadcastGlobalVariablesCallback, MetricAverageCallback,
# the rank-0 guards; docs/horovod.md); hvd.size() is autopar.num_workers() (Keras's own fit,
# the one-device reference, takes the job's: --size); Horovod's LearningRateWarmupCallback,
# its arithmetic as a Keras callback (Horovod does not install beside TensorFlow 2.21); 120
# synthetic 10x10 images in place of MNIST's, small layers, 3 epochs of 3 steps, float64,
# fixed seeds; prints the per-epoch logs, saves every variable.
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
import json  # autopar port
import os  # autopar port

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))  # autopar port

import numpy as np  # noqa: E402  autopar port
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402  autopar port: the callbacks' base class

import autopar  # noqa: E402  autopar port: was import horovod, horovod.tensorflow.keras as hvd

# autopar port: the program's arguments, float64, seeds
p = argparse.ArgumentParser()
p.add_argument("--keras", action="store_true", help="Keras's own model.fit on one device")
p.add_argument("--size", type=int, default=3, help="the job's workers (with --keras)")
p.add_argument("--spec")
p.add_argument("--run-option", default="hybrid")
p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
args = p.parse_args()
keras.config.set_floatx("float64")
keras.utils.set_random_seed(0)


# autopar port: Horovod's hvd.callbacks.LearningRateWarmupCallback (its _keras/callbacks.py),
# the same arithmetic as a Keras callback: from each batch's epoch fraction e (counted to the
# batch's end), the rate initial_lr / size * (e * (size - 1) / warmup_epochs + 1), up to
# initial_lr at the warm-up's end; the rate logged as "lr" at each epoch's end
class LearningRateWarmupCallback(keras.callbacks.Callback):
    def __init__(self, initial_lr, warmup_epochs=5, verbose=0, size=1):
        super().__init__()
        self.initial_lr, self.warmup_epochs, self.verbose = initial_lr, warmup_epochs, verbose
        self.size, self.epoch = size, None

    def on_train_begin(self, logs=None):
        self.steps_per_epoch = self.params["steps"]

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_batch_begin(self, batch, logs=None):
        if self.epoch >= self.warmup_epochs:
            return
        epoch = self.epoch + float(batch) / self.steps_per_epoch + 1.0 / self.steps_per_epoch
        self.model.optimizer.learning_rate.assign(
            self.initial_lr / self.size * (epoch * (self.size - 1) / self.warmup_epochs + 1))

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["lr"] = float(self.model.optimizer.learning_rate.numpy())
        if epoch == self.warmup_epochs - 1 and self.verbose > 0:
            print("\nEpoch %d: finished gradual learning rate warmup to %g." %
                  (epoch + 1, logs["lr"]))


def train():
    # Horovod: initialize Horovod.
    # hvd.init()  # autopar port: deleted (autopar.fit starts the job)
    # autopar port: hvd.size() is the job's number of workers
    size = args.size if args.keras else autopar.num_workers()

    # autopar port: the GPU pinning by hvd.local_rank() deleted (each worker sees the GPUs its
    # host gives it)

    # autopar port: 120 synthetic 10x10 images in place of
    # tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())
    rng = np.random.default_rng(0)
    mnist_images = rng.integers(0, 256, size=(120, 10, 10)).astype(np.uint8)
    mnist_labels = rng.integers(0, 10, size=(120,))

    dataset = tf.data.Dataset.from_tensor_slices(
        (tf.cast(mnist_images[..., tf.newaxis] / 255.0, tf.float64),  # autopar port: float64
                 tf.cast(mnist_labels, tf.int64))
    )
    # autopar port: the global batch, 12 per worker (was 128 per process)
    dataset = dataset.repeat().shuffle(10000).batch(12 * size)

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

    # Horovod: adjust learning rate based on number of GPUs.
    scaled_lr = 0.001 * size  # autopar port: hvd.size()
    opt = tf.optimizers.Adam(scaled_lr)

    # Horovod: add Horovod DistributedOptimizer.
    # autopar port: deleted (opt = hvd.DistributedOptimizer(opt, ...))

    # autopar port: experimental_run_tf_function=False deleted (no such argument in Keras 3)
    mnist_model.compile(loss=tf.losses.SparseCategoricalCrossentropy(),
                        optimizer=opt,
                        metrics=['accuracy'])

    callbacks = [
        # autopar port: hvd.callbacks.BroadcastGlobalVariablesCallback(0) deleted (autopar
        # starts every worker from the chief's values)

        # autopar port: hvd.callbacks.MetricAverageCallback() deleted (autopar.fit's logs are
        # the global batches')

        # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
        # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
        # the first three epochs. See https://arxiv.org/abs/1706.02677 for details.
        # autopar port: the Keras callback above, 2 warm-up epochs (3)
        LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1, size=size),
    ]

    # autopar port: the hvd.rank() == 0 guard deleted (autopar.fit's callbacks run on the chief)
    callbacks.append(tf.keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5'))

    # autopar port: verbose = 1 if hvd.rank() == 0 else 0 deleted (the chief logs)
    verbose = 1

    # Train the model.
    # Horovod: adjust number of steps based on number of GPUs.
    # autopar port: 3 steps of 3 epochs (500 // hvd.size() of 24); autopar.fit where not --keras
    fit = dict(steps_per_epoch=3, callbacks=callbacks, epochs=3, verbose=verbose)
    if args.keras:
        history, worker = mnist_model.fit(dataset, **fit).history, 0
    else:
        result = autopar.fit(mnist_model, dataset, None, args.spec,
                             autopar.Config(log_every_steps=0, run_option=args.run_option), **fit)
        history, worker = result.history, result.worker_index

    # autopar port: the per-epoch logs and every variable
    print("history " + json.dumps(history, sort_keys=True), flush=True)
    np.savez(args.out.format(worker=worker),
             **{v.path: v.numpy() for v in mnist_model.variables + opt.variables})

    # Return the model
    return mnist_model


if __name__ == '__main__':
    # autopar port: horovod.run's branch deleted (autopar.fit starts the job)
    train()
