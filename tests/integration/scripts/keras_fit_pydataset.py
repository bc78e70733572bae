"""A Keras 3 model fit on a keras.utils.PyDataset (batches of rows of
arrays, indexed), as Keras's guide to PyDataset writes one, shuffled by
fit (shuffle=True) and, with --reshuffle, by the dataset itself at each
epoch's end: "global" with NumPy's global random state (the same in every
process after keras.utils.set_random_seed), "fresh" with an unseeded
generator (each process its own order). Validation data is a PyDataset
too. --keras trains it with Keras's own model.fit on one device;
otherwise with autopar.fit on every worker of --spec. Saves the weights
and prints the per-epoch logs."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from _common import fit_then_save  # noqa: E402


class Rows(keras.utils.PyDataset):
    def __init__(self, x, y, batch_size, reshuffle=None, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y, self.batch_size, self.reshuffle = x, y, batch_size, reshuffle
        self.indices = np.arange(len(x))

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, i):
        rows = self.indices[i * self.batch_size:(i + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        if self.reshuffle == "global":
            np.random.shuffle(self.indices)
        elif self.reshuffle == "fresh":
            np.random.default_rng().shuffle(self.indices)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--reshuffle", choices=["global", "fresh"])
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(48, 6)), rng.normal(size=(48, 1))
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(5, activation="tanh")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"])
    fit = dict(epochs=3, verbose=0, shuffle=True, validation_data=Rows(x[:24], y[:24], 12))
    data = Rows(x, y, 12, args.reshuffle)
    fit_then_save(model, data, fit, args.keras, args.spec, args.out)


if __name__ == "__main__":
    main()
