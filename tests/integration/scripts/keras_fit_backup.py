"""A Keras 3 fit with keras.callbacks.BackupAndRestore, preempted and run
again, as a job on a cluster that loses a machine is: the first run raises
after its 2nd epoch (a callback after BackupAndRestore's backup, once: it
leaves a marker in --dir), the second run restores the backup and trains
the last 2 of its 4 epochs. --keras trains with Keras's own model.fit on
one device; otherwise autopar.fit on every worker of --spec. Prints the
run's per-epoch logs and saves every variable of the model and its
optimizer."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from _common import fit_then_save  # noqa: E402


class Preempted(keras.callbacks.Callback):
    """Raises at the end of the 2nd epoch of the first run."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            raise RuntimeError("preempted after the 2nd epoch")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--dir", required=True, help="the backup's and the marker's directory")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 4)), rng.integers(0, 3, 60)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    callbacks = [keras.callbacks.BackupAndRestore(os.path.join(args.dir, "backup")),
                 Preempted(os.path.join(args.dir, "preempted"))]
    fit_then_save(model, x, dict(epochs=4, batch_size=12, verbose=0, callbacks=callbacks),
                  args.keras, args.spec, args.out, y)


if __name__ == "__main__":
    main()
