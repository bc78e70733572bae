"""Two Keras 3 models fit one after the other in one script, as scripts that
compare models do (keras-io's wide, deep and cross networks fits three):
--keras trains them with Keras's own model.fit on one device; otherwise
each autopar.fit call is a job of its own, on the processes the first one
started (--spec). The models differ in their layers' shapes, and their
compiled losses' trackers have the same names (loss/total, loss/count).
Prints each model's per-epoch logs and saves every variable of both models
and their optimizers."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import autopar  # noqa: E402


def model_of(hidden: list[int], learning_rate: float):
    layers = [keras.layers.Dense(units, activation="tanh") for units in hidden]
    model = keras.Sequential([keras.Input((6,)), *layers, keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--keras", action="store_true", help="Keras's own model.fit")
    p.add_argument("--spec")
    p.add_argument("--run-option", default="hybrid")
    p.add_argument("--out", required=True, help=".npz; {worker} is replaced")
    args = p.parse_args()
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(60, 6)), rng.integers(0, 3, size=(60,))
    histories, variables, worker = [], {}, 0
    for name, hidden, learning_rate, batch in (("first", [8], 0.01, 12),
                                               ("second", [5, 4], 0.02, 15)):
        model = model_of(hidden, learning_rate)
        fit = dict(epochs=2, batch_size=batch, validation_split=0.2, verbose=0)
        if args.keras:
            history = model.fit(x, y, **fit).history
        else:
            result = autopar.fit(model, x, y, args.spec,
                                 autopar.Config(log_every_steps=0, run_option=args.run_option),
                                 **fit)
            history, worker = result.history, result.worker_index
        histories.append(history)
        variables.update({f"{name}/{v.path}": v.numpy()
                          for v in model.variables + model.optimizer.variables})
    print("history " + json.dumps(histories, sort_keys=True), flush=True)
    np.savez(args.out.format(worker=worker), **variables)


if __name__ == "__main__":
    main()
