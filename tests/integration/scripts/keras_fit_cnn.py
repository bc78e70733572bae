"""A Keras 3 convolutional network on scikit-learn's 8x8 digits, compiled
and fit as the Keras image-classification tutorials write it: Conv2D,
BatchNormalization, MaxPooling2D, Dropout, Dense; fit on arrays with
Keras's default shuffle, a validation split and "accuracy". --keras trains
it with Keras's own model.fit on one device; otherwise with autopar.fit on
every worker of --spec, with the batch statistics taken over the global
batch (Config(batch_norm_group="all")). 480 training examples in batches
of 45: each epoch's last batch has 30, which Keras trains on and which
splits over 3 workers. Prints the per-epoch logs and saves every variable
of the model and the optimizer."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import autopar  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    digits = load_digits()
    x = (digits.data[:600] / 16.0).reshape(-1, 8, 8, 1)
    y = digits.target[:600]
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.MaxPooling2D(),
        keras.layers.Dropout(0.2),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    fit = dict(epochs=2, batch_size=45, validation_split=0.2, verbose=0)
    if args.keras:
        history, worker = model.fit(x, y, **fit).history, 0
    else:
        result = autopar.fit(model, x, y, args.spec,
                             autopar.Config(log_every_steps=0, run_option=args.run_option,
                                            batch_norm_group="all"), **fit)
        history, worker = result.history, result.worker_index
    print("history " + json.dumps(history, sort_keys=True), flush=True)
    np.savez(args.out.format(worker=worker),
             **{v.path: v.numpy() for v in model.variables + model.optimizer.variables})


if __name__ == "__main__":
    main()
