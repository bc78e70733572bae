"""
Title: Writing a training loop from scratch in TensorFlow
Author: [fchollet](https://twitter.com/fchollet)
Date created: 2019/03/01
Last modified: 2023/06/25
Description: Writing low-level training & evaluation loops in TensorFlow.
Accelerator: None

Ported from keras-io (guides/writing_a_custom_training_loop_in_tensorflow.py at
1806537c4333fbff1f9fd038b78179beeda480fb, Apache License 2.0) with the smallest change, each
marked "autopar port": its loop with metrics and a tf.function step, run by autopar.get_runner
on every worker of --spec, each worker on its rows w, w+N, ... of each batch (--reference:
the guide's own loop on one device), the training metric combined over the workers before it
is read (Runner.combine_metrics) and the trained weights read into the Keras objects before
the validation loop (Runner.sync_python_variables); then the add_loss model's step, which the
guide defines without running it, run by the same loop as a second job of the script (with
an optimizer of its own: a Keras 3 optimizer applies only the variables it was built for).
The eager loops and the GAN are left out; 130 synthetic examples of 64 features in place of
MNIST's, 2 epochs of batches of 32 (the last of 4 examples, split 2/1/1 over 3 workers),
float64, fixed seeds. Prints each epoch's accuracies and saves every variable, after each
of the two parts.
"""

"""
## Setup
"""

import time
import os

# This guide can only be run with the TensorFlow backend.
os.environ["KERAS_BACKEND"] = "tensorflow"

import argparse  # autopar port
import json  # autopar port
import sys  # autopar port

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))  # autopar port

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import autopar  # noqa: E402  autopar port

# autopar port: the program's arguments, float64, seeds
p = argparse.ArgumentParser()
p.add_argument("--reference", action="store_true", help="the guide's own loop, one device")
p.add_argument("--spec")
p.add_argument("--run-option", default="hybrid")
p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
args = p.parse_args()
keras.config.set_floatx("float64")
keras.utils.set_random_seed(0)
results = {}  # autopar port: each part's per-epoch accuracies

"""
## A first end-to-end example
"""


def get_model():
    inputs = keras.Input(shape=(64,), name="digits")  # autopar port: 64 features (784)
    x1 = keras.layers.Dense(64, activation="relu")(inputs)
    x2 = keras.layers.Dense(64, activation="relu")(x1)
    outputs = keras.layers.Dense(10, name="predictions")(x2)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


model = get_model()

# Instantiate an optimizer.
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
# Instantiate a loss function.
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# Prepare the training dataset.
batch_size = 32
# autopar port: 130 synthetic examples of 64 features in place of keras.datasets.mnist's
rng = np.random.default_rng(0)
x_train = rng.integers(0, 256, size=(130, 8, 8)).astype(np.uint8)
y_train = rng.integers(0, 10, size=(130,)).astype(np.uint8)
x_train = np.reshape(x_train, (-1, 64))  # autopar port: 64 (784)

# Reserve 10,000 samples for validation.
x_val = x_train[-30:]  # autopar port: 30 (10,000)
y_val = y_train[-30:]
x_train = x_train[:-30]
y_train = y_train[:-30]

# Prepare the training dataset.
train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train))
train_dataset = train_dataset.shuffle(buffer_size=1024).batch(batch_size)

# Prepare the validation dataset.
val_dataset = tf.data.Dataset.from_tensor_slices((x_val, y_val))
val_dataset = val_dataset.batch(batch_size)

"""
(autopar port: the eager loops are left out.)

## Low-level handling of metrics
"""

# Get a fresh model
model = get_model()

# Instantiate an optimizer to train the model.
optimizer = keras.optimizers.Adam(learning_rate=1e-3)
# Instantiate a loss function.
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

# Prepare the metrics.
train_acc_metric = keras.metrics.SparseCategoricalAccuracy()
val_acc_metric = keras.metrics.SparseCategoricalAccuracy()

"""
## Speeding-up your training step with `tf.function`
"""


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss_value = loss_fn(y, logits)
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply(grads, model.trainable_weights)
    train_acc_metric.update_state(y, logits)
    return loss_value


"""
Let's do the same with the evaluation step:
"""


@tf.function
def test_step(x, y):
    val_logits = model(x, training=False)
    val_acc_metric.update_state(y, val_logits)


# autopar port: the loop below as a function of its step (run again for the add_loss step)
def train_and_validate(train_step, part):
    # autopar port: the step traced once, run by autopar on every worker of --spec, each
    # worker on its rows of each batch
    if args.reference:
        runner, call = None, train_step
    else:
        runner = autopar.get_runner(train_step.get_concrete_function(
            tf.TensorSpec([None, 64], tf.uint8), tf.TensorSpec([None], tf.uint8)), args.spec,
            autopar.Config(log_every_steps=0, run_option=args.run_option))
        n, w = runner.num_workers, runner.worker_index

        def call(x, y):
            return runner.call(x[w::n], y[w::n])
    results[part] = []
    epochs = 2
    for epoch in range(epochs):
        print(f"\nStart of epoch {epoch}")
        start_time = time.time()

        # Iterate over the batches of the dataset.
        for step, (x_batch_train, y_batch_train) in enumerate(train_dataset):
            loss_value = call(x_batch_train, y_batch_train)  # autopar port: call

            # Log every 100 batches.
            if step % 100 == 0:
                print(
                    f"Training loss (for 1 batch) at step {step}: {float(loss_value):.4f}"
                )
                print(f"Seen so far: {(step + 1) * batch_size} samples")

        # autopar port: the training metric's state summed over the workers
        if runner is not None:
            runner.combine_metrics([train_acc_metric])

        # Display metrics at the end of each epoch.
        train_acc = train_acc_metric.result()
        print(f"Training acc over epoch: {float(train_acc):.4f}")

        # Reset training metrics at the end of each epoch
        train_acc_metric.reset_state()

        # autopar port: the Keras model takes the trained weights for validation
        if runner is not None:
            runner.sync_python_variables()

        # Run a validation loop at the end of each epoch.
        for x_batch_val, y_batch_val in val_dataset:
            test_step(x_batch_val, y_batch_val)

        val_acc = val_acc_metric.result()
        val_acc_metric.reset_state()
        print(f"Validation acc: {float(val_acc):.4f}")
        print(f"Time taken: {time.time() - start_time:.2f}s")
        results[part].append([float(train_acc), float(val_acc)])  # autopar port
    if runner is not None:  # autopar port: the Keras objects hold the trained values
        runner.close()
        return runner.worker_index
    return 0


worker = train_and_validate(train_step, "metrics")  # autopar port
# autopar port: this part's accuracies and variables
print("results " + json.dumps(results, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker),
         **{v.path: v.numpy() for v in model.variables + optimizer.variables})

"""
## Low-level handling of losses tracked by the model
"""


class ActivityRegularizationLayer(keras.layers.Layer):
    def call(self, inputs):
        self.add_loss(1e-2 * tf.reduce_sum(inputs))
        return inputs


"""
Let's build a really simple model that uses it:
"""

inputs = keras.Input(shape=(64,), name="digits")  # autopar port: 64 features (784)
x = keras.layers.Dense(64, activation="relu")(inputs)
# Insert activity regularization as a layer
x = ActivityRegularizationLayer()(x)
x = keras.layers.Dense(64, activation="relu")(x)
outputs = keras.layers.Dense(10, name="predictions")(x)

model = keras.Model(inputs=inputs, outputs=outputs)
# autopar port: an optimizer for this model's variables
optimizer = keras.optimizers.Adam(learning_rate=1e-3)

"""
Here's what our training step should look like now:
"""


@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss_value = loss_fn(y, logits)
        # Add any extra losses created during the forward pass.
        loss_value += sum(model.losses)
    grads = tape.gradient(loss_value, model.trainable_weights)
    optimizer.apply(grads, model.trainable_weights)
    train_acc_metric.update_state(y, logits)
    return loss_value


# autopar port: trained by the loop above (the guide leaves it there); its accuracies and
# variables (the GAN is left out)
worker = train_and_validate(train_step, "add_loss")
print("results " + json.dumps(results, sort_keys=True), flush=True)
np.savez(args.out.format(worker=worker).replace(".npz", "_add_loss.npz"),
         **{v.path: v.numpy() for v in model.variables + optimizer.variables})
