"""Keras 3 models of scikit-learn's 8x8 digits, compiled and fit on arrays
as Keras users write them. --keras trains one with Keras's own model.fit
on one device; otherwise with autopar.fit on every worker of --spec. Prints
the per-epoch logs and saves every variable of the model and the optimizer.

--model cnn: a convolutional network as the Keras image-classification
tutorials write it: Conv2D, BatchNormalization, MaxPooling2D, Dropout,
Dense; Keras's default shuffle, a validation split and "accuracy"; with
autopar, autopar.fit's default Config: the batch statistics over the global
batch (batch_norm_group "auto"). 480 training examples in batches of 45:
each epoch's last batch has 30, which Keras trains on and which splits over
3 workers.

--model augmented: the same digits through image augmentation inside the
model, as keras-io's image classification from scratch writes it (random
flips, zooms and translations: one draw per image, each worker's images
given one device's draws), and a dilated convolution (its batch axis split
into blocks and joined again); "adam", 450 training examples in batches of
40, each epoch's last of 10.

--model summed: two outputs whose losses sum over the batch
(reduction="sum", loss_weights). 420 training examples in batches of 47,
which do not divide by 3 workers (shares of 16/16/15; each epoch's last
has 44) and 105 validation
examples in batches of 40 (shares of 14/13/13 and 9/8/8 rows on 3
workers)."""
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


def cnn():
    """(model, x, y, fit arguments, Config arguments)."""
    digits = load_digits()
    x = (digits.data[:600] / 16.0).reshape(-1, 8, 8, 1)
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
    return model, x, digits.target[:600], dict(batch_size=45), {}


def augmented():
    digits = load_digits()
    x = (digits.data[:563] / 16.0).reshape(-1, 8, 8, 1)
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.RandomFlip("horizontal"),
        keras.layers.RandomZoom(0.2),
        keras.layers.RandomTranslation(0.1, 0.1),
        keras.layers.Conv2D(4, 3, dilation_rate=2, padding="same", activation="relu"),
        keras.layers.Dropout(0.2),
        keras.layers.Flatten(),
        keras.layers.Dense(10)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model, x, digits.target[:563], dict(batch_size=40), {}


def summed():
    digits = load_digits()
    y = digits.target[:525]
    inputs = keras.Input((64,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(10, name="digit")(hidden),
                                 keras.layers.Dense(2, name="parity")(hidden)])
    model.compile(optimizer=keras.optimizers.Adam(0.001),
                  loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                   reduction="sum")] * 2,
                  loss_weights=[1.0, 0.5], metrics=[["accuracy"], []])
    return (model, digits.data[:525] / 16.0, [y, y % 2],
            dict(batch_size=47, validation_batch_size=40), {})


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["cnn", "augmented", "summed"], required=True)
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    model, x, y, fit, config = {"cnn": cnn, "augmented": augmented,
                                "summed": summed}[args.model]()
    fit.update(epochs=2, validation_split=0.2, verbose=0)
    if args.keras:
        history, worker = model.fit(x, y, **fit).history, 0
    else:
        result = autopar.fit(model, x, y, args.spec,
                             autopar.Config(log_every_steps=0, run_option=args.run_option,
                                            **config), **fit)
        history, worker = result.history, result.worker_index
    print("history " + json.dumps(history, sort_keys=True), flush=True)
    np.savez(args.out.format(worker=worker),
             **{v.path: v.numpy() for v in model.variables + model.optimizer.variables})


if __name__ == "__main__":
    main()
