"""A Keras 3 sequence tagger over padded sequences, compiled as such models
are: Embedding(mask_zero=True), whose mask the Dense layers on each position
carry to the loss, and a sparse categorical cross-entropy per position, so
Keras weighs each kept position by the batch's size / count of kept
positions; fit on a tf.data.Dataset of batches (a last one of 10 rows) for
3 epochs, with validation data, its accuracy a metric. With --weights-mean
no mask: each position has a sample weight and the loss divides by their sum
(reduction="mean_with_sample_weight"). With --padded the training
sequences keep their own lengths, each batch padded to its longest
(padded_batch: an input of unknown length), and a Dropout masks the
embeddings of every position. --keras trains it with Keras's own model.fit
on one device; otherwise with autopar.fit on every worker of --spec. Saves
the weights and prints the per-epoch losses."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from _common import fit_then_save  # noqa: E402

VOCAB, LENGTH = 30, 6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    p.add_argument("--weights-mean", action="store_true")
    p.add_argument("--padded", action="store_true")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    # sequences of 1 to LENGTH ids, padded with 0 at the end; a tag per id
    x = rng.integers(1, VOCAB, size=(58, LENGTH)).astype(np.int32)
    x[np.arange(LENGTH) >= rng.integers(1, LENGTH + 1, size=(58, 1))] = 0
    y = (x % 5).astype(np.int32)
    weights = (x > 0) * rng.uniform(0.5, 1.5, size=x.shape)
    model = keras.Sequential([keras.Input((None if args.padded else LENGTH,), dtype="int32"),
                              keras.layers.Embedding(VOCAB, 8, mask_zero=not args.weights_mean),
                              *([keras.layers.Dropout(0.3)] if args.padded else []),
                              keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(5)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, reduction=("mean_with_sample_weight" if args.weights_mean
                                                   else "sum_over_batch_size")),
                  # (of the kept positions alone: Keras's metrics read the mask)
                  metrics=["accuracy"])
    # 48 examples in batches of 16 and a last of 10, which 4 workers split
    # 3/3/2/2: their counts of kept positions differ in every batch
    data = (x[:58], y[:58]) + ((weights[:58],) if args.weights_mean else ())
    train = tf.data.Dataset.from_tensor_slices(data).batch(16)
    if args.padded:
        # each sequence without its padding, each batch padded to its longest
        lengths = (x[:58] > 0).sum(axis=1)
        spec = tf.TensorSpec([None], tf.int32)
        train = tf.data.Dataset.from_generator(
            lambda: ((x[i, :n], y[i, :n]) for i, n in enumerate(lengths)),
            output_signature=(spec, spec)).padded_batch(16)
    # validation in batches of 32 and 2: two workers have no row of the last
    fit = dict(epochs=3, verbose=0, validation_data=(
        (x[:34], y[:34]) + ((weights[:34],) if args.weights_mean else ())))
    fit_then_save(model, train, fit, args.keras, args.spec, args.out)


if __name__ == "__main__":
    main()
