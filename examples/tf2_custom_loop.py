"""A TensorFlow 2 custom training loop: a Keras 3 model, a Keras optimizer and
a `tf.function` step with a GradientTape, plus the lines marked "autopar"
that make it train on every worker of a cluster.

    python examples/tf2_custom_loop.py                                        # one device
    python examples/tf2_custom_loop.py --spec resource_specs/localhost_4workers_2servers.yaml

The model is a bag-of-words classifier over token ids: an embedding (its
gradient is sparse: with momentum SGD it lives on the servers in hybrid
mode) averaged, then two dense layers. autopar traces the step once
(`get_concrete_function`), lifts it into a graph it distributes, and
`runner.call(x, y)` runs one step as `train_step(x, y)` would. The step
updates Keras metrics, as TensorFlow's quickstart does, which the loop
resets each epoch and reads from Python: after each call they hold this
worker's values, and `runner.combine_metrics` sums their state over the
workers (the epoch's global batches). When the runner closes, the Keras
model and optimizer hold the trained values.

--batch-size is per worker: N workers train with a global batch N times as large.
"""
import argparse

import autopar  # autopar: first, so TensorFlow starts quiet
import keras
import numpy as np
import tensorflow as tf


VOCAB, LENGTH, CLASSES = 1000, 12, 4


def dataset(size, seed):
    """Sequences of token ids; the class is which quarter of the vocabulary
    most of their tokens come from."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, size=size)
    x = np.where(rng.random((size, LENGTH)) < 0.7,
                 y[:, None] * (VOCAB // CLASSES) + rng.integers(0, VOCAB // CLASSES, (size, LENGTH)),
                 rng.integers(0, VOCAB, (size, LENGTH)))
    return x.astype(np.int32), y.astype(np.int32)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", help="resource spec (YAML); omit to train on this device only")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--examples", type=int, default=8000, help="training examples per epoch")
    p.add_argument("--batch-size", type=int, default=32, help="examples per worker per step")
    args = p.parse_args()
    keras.utils.set_random_seed(0)

    model = keras.Sequential([keras.Input((LENGTH,), dtype="int32"),
                              keras.layers.Embedding(VOCAB, 16),
                              keras.layers.GlobalAveragePooling1D(),
                              keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    train_loss = keras.metrics.Mean(name="loss")
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    @tf.function(jit_compile=False)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = loss_fn(y, logits)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        train_loss(loss)
        train_accuracy(y, logits)

    # autopar: trace the step once and distribute it
    step = train_step.get_concrete_function(tf.TensorSpec([None, LENGTH], tf.int32),
                                            tf.TensorSpec([None], tf.int32))
    runner = autopar.get_runner(step, args.spec, autopar.Config(log_every_steps=50))
    ds = tf.data.Dataset.from_tensor_slices(dataset(args.examples, seed=1))
    ds = autopar.shard(ds)  # autopar: this worker's disjoint slice of the data
    ds = ds.shuffle(4096, seed=0).batch(args.batch_size, drop_remainder=True)
    with runner:
        for epoch in range(args.epochs):
            train_loss.reset_state()
            train_accuracy.reset_state()
            for x, y in ds:
                runner.call(x.numpy(), y.numpy())  # was: train_step(x, y)
            # autopar: the metrics over every worker's batches, as one device's
            runner.combine_metrics([train_loss, train_accuracy])
            if runner.is_chief:
                print(f"epoch {epoch + 1}: loss {float(train_loss.result()):.4f}, "
                      f"accuracy {float(train_accuracy.result()):.3f}", flush=True)
    # The runner closed: the Keras model holds the trained weights.
    x_test, y_test = dataset(2000, seed=2)
    accuracy = np.mean(np.argmax(model(x_test), axis=1) == y_test)
    print(f"worker {runner.worker_index}: test accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
