"""A Keras 3 model compiled the way many scripts compile it: a string loss
("mse"), loss_weights, a kernel regularizer and dropout; fit on a
tf.data.Dataset of batches (shuffled with a seed, each epoch anew; sample
weights in its elements; a last, smaller batch that does not split evenly
over the workers) with sample weights (the
validation data's too), an EarlyStopping callback that restores the best
weights and a learning-rate schedule; with --hinge, labels of 0 and 1 and
Keras's Hinge loss; with --unreduced, Keras's MeanSquaredError of
reduction=None (one loss per example, whose sum Keras differentiates and
whose mean its loss tracker logs). --keras trains it with Keras's own model.fit on one device;
otherwise with autopar.fit (on every worker of --spec, or one device
without). Saves the weights and prints the per-epoch losses."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import fit_then_save  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    p.add_argument("--examples", type=int, default=58, help="training examples, at most 64")
    p.add_argument("--hinge", action="store_true",
                   help="labels of 0 and 1 and Keras's Hinge loss, which makes them -1 and 1 "
                        "where every label of the batch is 0 or 1 (a cond on the whole batch)")
    p.add_argument("--unreduced", action="store_true",
                   help="MeanSquaredError(reduction=None): the loss a vector of the batch's "
                        "per-example losses")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 6)), rng.normal(size=(64, 1))
    weights = rng.uniform(0.5, 1.5, size=64)   # each example's weight in the loss
    inp = keras.Input((6,))
    # (not with --unreduced: Keras's fit cannot add a scalar regularization
    # loss to a vector)
    hidden = keras.layers.Dense(4, activation="tanh", kernel_regularizer=(
        None if args.unreduced else keras.regularizers.L2(0.01)))(inp)
    # a mask per example, which each worker draws as one device does for
    # its examples (transforms.random_draws)
    hidden = keras.layers.Dropout(0.25)(hidden)
    model = keras.Model(inp, keras.layers.Dense(1)(hidden))
    if args.hinge:
        y = (y > 0).astype(np.float64)
    # (a batch's summed loss: the rate divided by the batch's size)
    model.compile(optimizer=keras.optimizers.SGD(0.1 / 16 if args.unreduced else 0.1,
                                                 momentum=0.5),
                  loss=(keras.losses.Hinge() if args.hinge
                        else keras.losses.MeanSquaredError(reduction=None) if args.unreduced
                        else "mse"), loss_weights=3.0)
    # Callbacks that read the trained weights and write the model's and the
    # optimizer's variables: the learning rate halved from the second epoch
    # on, and EarlyStopping ends Keras's fit after epoch 4 of 5, the first
    # without an improvement of val_loss by 0.1, restoring epoch 3's weights.
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr / 2 if epoch else lr)
    stop = keras.callbacks.EarlyStopping(monitor="val_loss", patience=1, min_delta=0.1,
                                         restore_best_weights=True)
    # 58 examples in batches of 16: the last of 10, which 4 workers split
    # 3/3/2/2, each weighing its gradients by its rows
    n = args.examples
    train = tf.data.Dataset.from_tensor_slices((x[:n], y[:n], weights[:n])).shuffle(
        n, seed=1).batch(16)
    fit = dict(epochs=5, verbose=0, validation_data=(x[:20], y[:20], weights[:20]),
               callbacks=[schedule, stop])
    fit_then_save(model, train, fit, args.keras, args.spec, args.out)


if __name__ == "__main__":
    main()
