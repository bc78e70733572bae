"""fit() arguments autopar.fit takes as Keras's model.fit takes them:
validation_split (the last examples, before shuffling), validation_freq,
validation_batch_size, initial_epoch, class_weight, and a tf.data.Dataset
for x and validation_data. One device (the
cross-worker sums are the distributed tests'), float64, against Keras's own
model.fit on the same model: every epoch's logs and the weights."""
import numpy as np
import pytest

import autopar
from tests.programs import keras_step


@pytest.fixture(autouse=True)
def _keras_settings():
    with keras_step.keras_settings_kept():
        yield


def _trained(fit, dataset=False, steps=False, shuffle=False):
    import keras
    import tensorflow as tf
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 30, size=(60, 4)).astype(np.int32)
    y = rng.integers(0, 3, size=(60,)).astype(np.int32)
    inputs = keras.Input((4,), dtype="int32")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 6)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))
    model.compile(optimizer=keras.optimizers.SGD(0.5, momentum=0.5),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    if dataset:
        # batches of 9 (the last of 6), reshuffled each epoch with a seed;
        # validation batches of a dataset, shuffled once
        train = tf.data.Dataset.from_tensor_slices((x[:42], y[:42])).shuffle(
            42, seed=3).batch(9)
        valid = tf.data.Dataset.from_tensor_slices((x[42:], y[42:])).shuffle(
            18, seed=4, reshuffle_each_iteration=False).batch(5)
        if steps:
            # endless: 4 batches an epoch, each going on where the last
            # ended (5 batches make a pass); 2 validation batches, afresh
            train, valid = train.repeat(), valid.repeat()
            steps = dict(steps_per_epoch=4, validation_steps=2)
        history = fit(model, train, epochs=3, verbose=0, shuffle=False, validation_data=valid,
                      class_weight={0: 2.0, 1: 0.5, 2: 1.0},   # Keras needs every class here
                      **(steps or {}))
    else:
        history = fit(model, x, y, epochs=4, batch_size=9, shuffle=shuffle, verbose=0,
                      validation_split=0.25, validation_freq=2, validation_batch_size=5,
                      initial_epoch=1, class_weight={0: 2.0, 1: 0.5})
    return history.history, [v.numpy() for v in model.variables + model.optimizer.variables]


@pytest.mark.slow
def test_validation_and_epoch_arguments_as_keras_fit_takes_them():
    expected, expected_values = _trained(lambda model, *a, **k: model.fit(*a, **k))
    got, values = _trained(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k))
    # epochs 2..4 trained (initial_epoch 1), validated after epochs 2 and 4
    assert len(expected["loss"]) == 3 and len(expected["val_loss"]) == 2
    _assert_same(got, values, expected, expected_values)


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [True, "batch"])
def test_arrays_are_shuffled_as_keras_fit_shuffles_them(shuffle):
    """Arrays shuffled (every example, or within each batch) in the order
    Keras's own fit takes them in the same program (keras.utils.set_random_seed
    before the model is built): the same logs and weights (before, autopar.fit
    drew a permutation of its own: every epoch's loss differed)."""
    expected, expected_values = _trained(lambda model, *a, **k: model.fit(*a, **k),
                                         shuffle=shuffle)
    got, values = _trained(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k), shuffle=shuffle)
    _assert_same(got, values, expected, expected_values)


@pytest.mark.parametrize("steps", [False, True], ids=["passes", "steps_per_epoch"])
def test_a_dataset_is_read_as_keras_fit_reads_it(steps):
    """Each epoch's batches in the order Keras's fit iterates a reshuffling
    dataset (its k-th epoch is the dataset's (2k-1)-th iteration), the last,
    smaller batch trained on, class weights per batch, a validation dataset;
    or, of an endless dataset, steps_per_epoch batches going on where the
    last epoch ended, and validation_steps batches."""
    def fit(model, *a, **k):
        return autopar.fit(model, *a, config=autopar.Config(log_every_steps=0), **k)
    expected, expected_values = _trained(lambda model, *a, **k: model.fit(*a, **k),
                                         dataset=True, steps=steps)
    got, values = _trained(fit, dataset=True, steps=steps)
    assert len(expected["loss"]) == 3 and len(expected["val_loss"]) == 3
    _assert_same(got, values, expected, expected_values)


def _assert_same(got, values, expected, expected_values):
    """Every epoch's logs and every variable of the model and optimizer."""
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-12, err_msg=name)
    for value, expected_value in zip(values, expected_values, strict=True):
        np.testing.assert_allclose(value, expected_value, rtol=1e-9, atol=1e-12)


def _two_inputs_two_outputs(fit, dataset=False):
    """A model with named inputs (a dict, as Keras's structured-data
    examples feed it) and two outputs with a loss each."""
    import keras
    import tensorflow as tf
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = {"ids": rng.integers(0, 20, size=(40, 3)).astype(np.int32),
         "num": rng.normal(size=(40, 2))}
    y = [rng.normal(size=(40, 1)), rng.integers(0, 2, size=(40, 1)).astype(np.float64)]
    ids, num = keras.Input((3,), dtype="int32", name="ids"), keras.Input((2,), name="num")
    h = keras.layers.Concatenate()([keras.layers.Flatten()(keras.layers.Embedding(20, 2)(ids)),
                                    num])
    h = keras.layers.Dropout(0.2)(keras.layers.Dense(5, activation="relu")(h))
    model = keras.Model({"ids": ids, "num": num},
                        [keras.layers.Dense(1, name="value")(h),
                         keras.layers.Dense(1, activation="sigmoid", name="label")(h)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=["mse", "binary_crossentropy"], loss_weights=[1.0, 0.5])
    if dataset:
        train = tf.data.Dataset.from_tensor_slices((x, tuple(y))).shuffle(40, seed=5).batch(8)
        history = fit(model, train, epochs=2, verbose=0, shuffle=False)
    else:
        history = fit(model, x, y, epochs=2, batch_size=8, shuffle=False, verbose=0,
                      validation_split=0.2)
    return history.history, [v.numpy() for v in model.variables + model.optimizer.variables]


@pytest.mark.slow
@pytest.mark.parametrize("dataset", [False, True], ids=["arrays", "dataset"])
def test_several_inputs_and_outputs(dataset):
    expected, expected_values = _two_inputs_two_outputs(
        lambda model, *a, **k: model.fit(*a, **k), dataset)
    got, values = _two_inputs_two_outputs(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k), dataset)
    # each output's loss logged too, as Keras's fit logs it
    assert "label_loss" in got and ("val_value_loss" in got) != dataset
    _assert_same(got, values, expected, expected_values)


def _string_features(fit):
    """Keras's preprocessing layers inside the model, as its structured-data
    and text examples build them: a StringLookup vocabulary (a lookup table
    the traced step captures) and a TextVectorization."""
    import keras
    import tensorflow as tf
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(2)
    words = np.array(["red", "green", "blue", "cyan"])
    x = {"colour": words[rng.integers(0, 4, size=(24, 1))],
         "text": np.array([" ".join(words[rng.integers(0, 4, size=3)]) for _ in range(24)])}
    y = rng.normal(size=(24, 1))
    colour = keras.Input((1,), dtype="string", name="colour")
    text = keras.Input((), dtype="string", name="text")
    vectorize = keras.layers.TextVectorization(max_tokens=6, output_mode="multi_hot")
    vectorize.adapt(x["text"])
    h = keras.layers.Concatenate()([
        keras.layers.StringLookup(vocabulary=["red", "green", "blue"], output_mode="one_hot")(
            colour), vectorize(text)])
    model = keras.Model({"colour": colour, "text": text}, keras.layers.Dense(1)(h))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    # strings as tensors: Keras's fit takes no NumPy string arrays
    x = {k: tf.constant(v) for k, v in x.items()}
    history = fit(model, x, y, epochs=2, batch_size=6, shuffle=False, verbose=0)
    return history.history, [v.numpy() for v in model.variables + model.optimizer.variables]


def test_a_model_with_lookup_tables():
    """Before: refused (`the traced function captures the resource ... which
    is not a tf.Variable`); the tables are now lifted with their keys and
    values."""
    expected, expected_values = _string_features(lambda model, *a, **k: model.fit(*a, **k))
    got, values = _string_features(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k))
    _assert_same(got, values, expected, expected_values)


def _csv_features(fit, path, known_length=True):
    """keras-io's structured-data examples' input pipeline: a CSV file read
    by tf.data.experimental.make_csv_dataset (a dict of numeric and string
    columns, shuffled with the global seed), string columns looked up by a
    StringLookup that has no OOV index (it rejects any string it does not
    know), the validation set a CSV dataset too."""
    import keras
    import tensorflow as tf
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    header = ["size", "colour", "kind"]

    def dataset(shuffle):
        dataset = tf.data.experimental.make_csv_dataset(
            str(path), batch_size=7, column_names=header, column_defaults=[0.0, "NA", 0],
            label_name="kind", num_epochs=1, header=True, shuffle=shuffle).map(
                lambda features, target: (dict(features), target))
        return dataset.apply(tf.data.experimental.assert_cardinality(4)) if known_length \
            else dataset
    inputs = {"size": keras.Input((), name="size", dtype="float64"),
              "colour": keras.Input((), name="colour", dtype="string")}
    lookup = keras.layers.StringLookup(vocabulary=["red", "green", "blue"], mask_token=None,
                                       num_oov_indices=0, output_mode="binary")
    h = keras.layers.Concatenate()([keras.ops.expand_dims(inputs["size"], -1),
                                    lookup(keras.ops.expand_dims(inputs["colour"], -1))])
    h = keras.layers.Dropout(0.3)(keras.layers.Dense(4, activation="relu")(h))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(h))
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                  metrics=[keras.metrics.SparseCategoricalAccuracy()])
    history = fit(model, dataset(True), epochs=2, verbose=0, validation_data=dataset(False))
    return history.history, [v.numpy() for v in model.variables + model.optimizer.variables]


def _csv_file(tmp_path):
    rng = np.random.default_rng(3)
    path = tmp_path / "rows.csv"
    path.write_text("size,colour,kind\n" + "".join(
        f"{rng.normal():.3f},{rng.choice(['red', 'green', 'blue'])},{rng.integers(0, 2)}\n"
        for _ in range(26)))
    return path


@pytest.mark.slow
def test_an_epoch_of_unknown_length_counts_as_keras_fit_counts(tmp_path):
    """A dataset of unknown length (make_csv_dataset's): Keras's fit calls
    its step until one finds no batch, and that call's writes that wait
    for no batch run (the optimizer's iteration count, the dropout's seed).
    Before: autopar.fit counted one Adam iteration less each epoch, and
    the second epoch's weights differed (Adam's bias correction)."""
    path = _csv_file(tmp_path)
    expected, expected_values = _csv_features(lambda model, *a, **k: model.fit(*a, **k), path,
                                              known_length=False)
    got, values = _csv_features(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k), path, known_length=False)
    _assert_same(got, values, expected, expected_values)


@pytest.mark.slow
def test_string_features_of_a_csv_dataset(tmp_path):
    """Before: autopar.fit crashed building the loss before tracing (it
    called the model on zeros of each feature's dtype: an object array of
    ints for a string column); the model is built from symbolic inputs of
    the dataset's specs now, as Keras's fit builds it, reading no batch."""
    path = _csv_file(tmp_path)
    expected, expected_values = _csv_features(lambda model, *a, **k: model.fit(*a, **k), path)
    got, values = _csv_features(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k), path)
    assert len(got["loss"]) == 2 and "val_sparse_categorical_accuracy" in got
    _assert_same(got, values, expected, expected_values)


def _masked_sequences(fit, sample_weights=False):
    """A tagger over padded sequences (Embedding(mask_zero=True)), its
    accuracy a compiled metric: Keras's metrics read the padding mask from
    the predictions (y_pred._keras_mask) and count kept positions alone;
    with sample weights a weighted metric too, and validation data."""
    import keras
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(4)
    x = rng.integers(1, 20, size=(30, 6)).astype(np.int32)
    x[np.arange(6) >= rng.integers(1, 7, size=(30, 1))] = 0
    y = (x % 4).astype(np.int32)
    model = keras.Sequential([keras.Input((6,), dtype="int32"),
                              keras.layers.Embedding(20, 5, mask_zero=True),
                              keras.layers.Dense(4, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"], weighted_metrics=(
                      [keras.metrics.SparseCategoricalAccuracy(name="weighted")]
                      if sample_weights else None))
    # one weight per position (Keras's loss takes no per-example weight with a mask)
    weights = rng.uniform(0.5, 1.5, size=(30, 6)) if sample_weights else None
    history = fit(model, x[:24], y[:24], epochs=2, batch_size=8, shuffle=False, verbose=0,
                  sample_weight=None if weights is None else weights[:24],
                  validation_data=(x[24:], y[24:]) + (() if weights is None else
                                                      (weights[24:],)))
    return history.history, [v.numpy() for v in model.variables + model.optimizer.variables]


@pytest.mark.slow
@pytest.mark.parametrize("sample_weights", [False, True], ids=["mask", "mask_and_weights"])
def test_metrics_of_a_masked_sequence_see_the_mask(sample_weights):
    """Before: the weights were Keras's but the logged accuracy was not
    (0.299 against 0.540): autopar computed the metrics from the
    predictions runner.call returns, which carry no mask; the step returns
    the mask Keras attached to them now, and the metrics see it."""
    expected, expected_values = _masked_sequences(
        lambda model, *a, **k: model.fit(*a, **k), sample_weights)
    got, values = _masked_sequences(lambda model, *a, **k: autopar.fit(
        model, *a, config=autopar.Config(log_every_steps=0), **k), sample_weights)
    assert "val_accuracy" in got and ("val_weighted" in got) == sample_weights
    _assert_same(got, values, expected, expected_values)


def _with_callbacks(fit, data: str = "arrays", per_call: int = 1):
    """Callbacks with every hook Keras's fit runs: one recording each call
    and its logs, a per-batch learning-rate warm-up (Horovod's
    LearningRateWarmupCallback's arithmetic: each batch's rate from the
    epoch's fraction done) and one that stops training in the middle of an
    epoch (model.stop_training in on_train_batch_end), with validation.
    `data`: arrays, datasets of unknown length (filtered) or datasets that
    repeat, read 5 steps an epoch and 2 a validation; `per_call`: the
    model's steps_per_execution."""
    import keras
    import tensorflow as tf
    keras.config.set_floatx("float64")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(50, 4)), rng.integers(0, 3, size=(50,))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="relu"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.Adam(0.05), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=per_call)
    if data == "arrays":
        given = dict(x=x[:40], y=y[:40], batch_size=6, shuffle=False,
                     validation_data=(x[40:], y[40:]), validation_batch_size=4)
    else:
        def batches(start, end, size):
            examples = tf.data.Dataset.from_tensor_slices((x[start:end], y[start:end]))
            if data == "repeating":
                return examples.batch(size).repeat()
            return examples.filter(lambda *_: True).batch(size)
        given = dict(x=batches(0, 40, 6), validation_data=batches(40, 50, 4))
        if data == "repeating":
            given.update(steps_per_epoch=5, validation_steps=2)
    calls = []

    class Record(keras.callbacks.Callback):
        def __getattribute__(self, name):
            hook = super().__getattribute__(name)
            if not name.startswith("on_") or name in ("on_batch_begin", "on_batch_end"):
                return hook

            def recorded(*args, **kwargs):
                logs = kwargs.get("logs", args[-1] if args and isinstance(args[-1], dict)
                                  else None)
                calls.append((name, [a for a in args if not isinstance(a, dict)],
                              {k: round(float(v), 9) for k, v in (logs or {}).items()}))
                return hook(*args, **kwargs)
            return recorded

    class WarmUp(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            done = self.epoch + batch / (self.params["steps"] or 7)
            self.model.optimizer.learning_rate.assign(0.05 * min(1.0, (1 + done) / 2))

    class StopInTheMiddle(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if len(calls) and self.model.optimizer.iterations.numpy() >= 9:
                self.model.stop_training = True
    history = fit(model, epochs=3, verbose=0, **given,
                  # (LearningRateScheduler, its rate unchanged, adds it to each
                  # epoch's logs, which Keras's on_train_end does not see)
                  callbacks=[Record(), WarmUp(), StopInTheMiddle(),
                             keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr)])
    # (Keras's History also holds the epochs trained, the callbacks' params
    # and the model: before, autopar's had no params nor model)
    assert history.model is model
    return ((history.history, history.epoch, history.params),
            [v.numpy() for v in model.variables + model.optimizer.variables], calls)


# data, steps_per_execution: Keras's own calls of on_train_batch_begin and
# _end and on_test_batch_end, then its callbacks' params' steps. Training
# stops after the call that reaches iteration 9: with 3 steps a call, the
# 2nd epoch's 1st (epochs of 7 batches), or its 1st of 6 (3 a call of 5 steps)
CALLS = {("arrays", 1): (9, 9, 6, 7), ("arrays", 3): (4, 4, 2, 7),
         # one more on_*_batch_begin a pass, with no _end: Keras's fit calls
         # its function again and finds no batch (a call of one step counts
         # an iteration there: the 2nd epoch's 1st batch reaches 9)
         ("unknown length", 1): (9, 8, 6, None), ("unknown length", 3): (5, 4, 2, None),
         ("repeating", 3): (3, 3, 2, 5)}


@pytest.mark.slow
@pytest.mark.parametrize("data,per_call", list(CALLS), ids=[f"{d}-{k}" for d, k in CALLS])
def test_callbacks_run_every_hook_keras_fit_runs(data, per_call):
    """Before: only on_train_begin, on_epoch_begin/_end and on_train_end
    ran; a per-batch warm-up never changed the learning rate (Horovod's
    MNIST example ended at another rate, the weights 2,460 % off), no
    batch hook saw a log, nothing stopped training inside an epoch. Now
    each hook runs where Keras's fit runs it, with Keras's logs (a batch's:
    the epoch's so far; on_train_end's: the last epoch's as fit made them,
    without what callbacks added, a learning rate: before, the History's),
    and what it changes trains. With steps_per_execution, the per-batch
    hooks run once a call of several batches, and a pass of repeating data
    reads whole calls (before: once a batch, the warm-up's rate changed at
    every batch; 5 batches an epoch, not Keras's 6); past the end of data
    of unknown length, one more batch hook begins (before: none), and with
    several steps a call the optimizer counts no step there (it did: Adam's
    bias correction off from the 2nd epoch)."""
    expected, expected_values, expected_calls = _with_callbacks(
        lambda model, **k: model.fit(**k), data, per_call)
    got, values, calls = _with_callbacks(lambda model, **k: autopar.fit(
        model, config=autopar.Config(log_every_steps=0), **k), data, per_call)
    names = [c[0] for c in expected_calls]
    assert (names.count("on_train_batch_begin"), names.count("on_train_batch_end"),
            names.count("on_test_batch_end")) == CALLS[data, per_call][:3]
    assert [c[:2] for c in calls] == [c[:2] for c in expected_calls]
    for (name, args, logs), (_, _, expected_logs) in zip(calls, expected_calls):
        assert logs.keys() == expected_logs.keys(), name
        np.testing.assert_allclose(list(logs.values()), list(expected_logs.values()),
                                   rtol=1e-9, err_msg=f"{name} {args}")
    assert got[1:] == expected[1:] == (
        [0, 1], {"verbose": 0, "epochs": 3, "steps": CALLS[data, per_call][3]})
    _assert_same(got[0], values, expected[0], expected_values)
