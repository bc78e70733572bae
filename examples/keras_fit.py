"""A Keras 3 MLP on scikit-learn's bundled handwritten digits trained with
fit(): a plain single-device Keras script, plus the one line marked
"autopar" that makes it train on every worker of a cluster.

    python examples/keras_fit.py                                          # one device
    python examples/keras_fit.py --spec resource_specs/localhost_2workers.yaml
    python examples/keras_fit.py --keras        # Keras's own model.fit, to compare

`autopar.fit(model, x, y, spec, ...)` takes fit()'s arguments (epochs,
batch_size: the global batch, validation_data, callbacks, shuffle); the
per-epoch logs are aggregated over all workers and printed by the chief.
The same seeds give the same initial weights and batches on one device and
on N (Keras's fit's shuffled order; each epoch's last, smaller batch of 28
examples splits over 2 or 4 workers, so it trains as in Keras's fit): the
accuracy (and, in float64, every weight) is model.fit's on one device.
"""
import argparse

import autopar  # autopar: first, so TensorFlow starts quiet
import keras
import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from sklearn.preprocessing import StandardScaler



def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", help="resource spec (YAML); omit to train on this device only")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--run-option", default="hybrid", help="autopar.Config.run_option")
    p.add_argument("--save", help="save the trained weights to this .npz ({worker} is replaced)")
    p.add_argument("--csv", help="log every epoch to this CSV file (a Keras CSVLogger callback)")
    p.add_argument("--keras", action="store_true",
                   help="train with Keras's own model.fit on this device (for comparison)")
    args = p.parse_args()
    keras.config.set_floatx(args.dtype)
    keras.utils.set_random_seed(0)

    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        digits.data, digits.target, test_size=361, random_state=0, stratify=digits.target)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = (scaler.transform(a).astype(args.dtype) for a in (x_train, x_test))

    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    fit = dict(epochs=args.epochs, batch_size=args.batch_size, validation_data=(x_test, y_test),
               callbacks=[keras.callbacks.CSVLogger(args.csv)] if args.csv else [])
    if args.keras:
        history, worker = model.fit(x_train, y_train, verbose=0, **fit), 0
    else:
        # autopar: was model.fit(x_train, y_train, epochs=..., batch_size=..., validation_data=...)
        history = autopar.fit(model, x_train, y_train, args.spec,
                              autopar.Config(log_every_steps=0, run_option=args.run_option),
                              **fit)
        worker = history.worker_index
    print("history", {k: [round(v, 6) for v in values] for k, values in history.history.items()},
          flush=True)
    print(f"test accuracy: {history.history['val_accuracy'][-1]:.3f}", flush=True)
    if args.save:
        np.savez(args.save.format(worker=worker),
                 **{v.path: v.numpy() for v in model.variables})


if __name__ == "__main__":
    main()
