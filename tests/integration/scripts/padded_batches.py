"""A TensorFlow 2 custom loop over sequences of different lengths, batched
by padded_batch after autopar.shard, as text programs batch them: a traced
step of TensorSpec [None, None] ids, an Embedding averaged over every
position (the padding's too) and a Dense. One device (no --spec) pads each
global batch of 12; each of the workers of --spec pads its own 4. With
--fixed every batch is padded to 8 ids. Saves every variable of the model
to --out ({worker} replaced)."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import autopar  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--spec")
p.add_argument("--fixed", action="store_true", help="pad every batch to 8 ids")
p.add_argument("--out", required=True)
args = p.parse_args()
keras.config.set_floatx("float64")
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
sequences = [rng.integers(1, 20, size=rng.integers(2, 9)).astype(np.int32) for _ in range(36)]
labels = rng.integers(0, 3, size=36).astype(np.int32)
ds = tf.data.Dataset.from_generator(
    lambda: iter(zip(sequences, labels)),
    output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)))
model = keras.Sequential([keras.Input((None,), dtype="int32"), keras.layers.Embedding(20, 4),
                          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
optimizer = keras.optimizers.SGD(0.1)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss


shapes = ([8], []) if args.fixed else None
if args.spec:
    step = train_step.get_concrete_function(tf.TensorSpec([None, None], tf.int32),
                                            tf.TensorSpec([None], tf.int32))
    runner = autopar.get_runner(step, args.spec, autopar.Config(log_every_steps=0))
    with runner:
        for x, y in autopar.shard(ds).padded_batch(4, padded_shapes=shapes):
            runner.call(x.numpy(), y.numpy())
    worker = runner.worker_index
else:
    for x, y in ds.padded_batch(12, padded_shapes=shapes):
        train_step(x, y)
    worker = 0
np.savez(args.out.format(worker=worker), **{v.path: v.numpy() for v in model.variables})
