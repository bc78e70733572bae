"""What autopar.fit refuses before it starts a job, each by name: fit()
arguments it does not take, several inputs, an uncompiled model, a
PyDataset it cannot read as fit does; the
per-example weights it takes (class_weight as Keras's fit turns it into
weights); and that it runs a model's own training and evaluation steps
and its own loss."""
import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import AutoparError

X = np.zeros((8, 3), np.float32)
Y = np.zeros((8, 1), np.float32)


def _model(cls_body=None):
    import keras
    cls = type("OwnStepModel", (keras.Model,), cls_body or {})
    inputs = keras.Input((3,))
    model = cls(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    return model


def _dataset():
    import tensorflow as tf
    # no global seed (another test may have set one): a shuffle without a
    # seed of its own then has none
    tf.random.set_seed(None)
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)


def _own_step(self, data):
    raise AssertionError("autopar.fit ran the model's own step")


def test_a_models_own_steps_are_what_fit_runs():
    """A model's own train_step and test_step run (traced) on what Keras's
    fit hands them, x alone when fit is given no y; their logs are the
    epoch's logs (the metric they update, reset at each epoch's start and
    each validation's: a count of the examples seen)."""
    import keras

    def count(self, data):
        x = data[0] if isinstance(data, tuple) else data
        self.seen.update_state(tf.ones(tf.shape(x)[:1]))
        return {"examples": self.seen.result()}

    def metrics(self):
        return [self.seen]
    model = _model({"train_step": count, "test_step": count, "metrics": property(metrics)})
    model.seen = keras.metrics.Sum(name="examples")
    history = autopar.fit(model, X, None, epochs=2, batch_size=4, verbose=0,
                          validation_data=(X[:6], Y[:6]))
    assert history.history == {"examples": [8.0, 8.0], "val_examples": [6.0, 6.0]}


def test_a_models_own_compute_loss_is_what_fit_trains():
    """A model that overrides compute_loss (a distiller's loss of its
    student's and its teacher's outputs, written before Keras 3.3: no
    `training` argument) and compiles no loss trains as Keras's fit trains
    it, with the compiled metrics logged (before: refused as uncompiled)."""
    import keras

    def build():
        keras.utils.set_random_seed(1)
        teacher = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None,
                         allow_empty=False):
            return keras.ops.mean(keras.losses.mean_squared_error(y, y_pred)
                                  + 0.5 * keras.losses.mean_squared_error(teacher(x), y_pred))
        cls = type("Distiller", (keras.Model,), {"compute_loss": compute_loss})
        inputs = keras.Input((3,))
        model = cls(inputs, keras.layers.Dense(2)(inputs))
        model.compile(optimizer=keras.optimizers.SGD(0.1), metrics=["mae"])
        return model
    x = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
    y = np.random.default_rng(1).normal(size=(8, 2)).astype(np.float32)
    expected = build()
    logs = expected.fit(x, y, epochs=2, batch_size=4, shuffle=False, verbose=0).history
    model = build()
    history = autopar.fit(model, x, y, epochs=2, batch_size=4, shuffle=False, verbose=0)
    assert sorted(history.history) == ["loss", "mae"]
    for name, values in logs.items():
        np.testing.assert_allclose(history.history[name], values, rtol=1e-5, err_msg=name)
    for a, b in zip(model.weights, expected.weights):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def _rows(batches, endless=False):
    import keras

    class Batches(keras.utils.PyDataset):
        def __getitem__(self, i):
            return batches[i]
    if not endless:
        Batches.__len__ = lambda self: len(batches)
    return Batches()


@pytest.mark.parametrize("x,y,message", [
    (lambda: _rows([(X, Y)]), Y, "y is not given with a PyDataset x"),
    (lambda: _rows([(X,)]), None, "x yields batches of inputs alone; the compiled loss takes "
                                  r"\(x, y\)"),
    (lambda: _rows([(X, Y)], endless=True), None, r"x \(a PyDataset\) has no length"),
    (lambda: _rows([[X, Y, Y, Y]]), None, r"x\[0\] is a tuple; a PyDataset's batch is"),
])
def test_a_pydataset_it_cannot_read_as_fit_does_is_refused(x, y, message):
    with pytest.raises(AutoparError, match=message):
        autopar.fit(_model(), x(), y, epochs=1, verbose=0)


@pytest.mark.parametrize("examples,batch_size,message", [
    # 50 in batches of 8: a last batch of 2 on 3 workers (before: left out
    # with a warning, and every variable ended off one device's)
    (50, 8, "50 examples make a last batch of 2: each of the 3 workers needs a row of every "
            "batch"),
    (2, 8, "2 examples make a first batch of 2: each of the 3 workers"),
])
def test_a_batch_of_fewer_examples_than_workers_is_refused_before_any_step(
        examples, batch_size, message):
    from autopar.runtime.fit_data import ArrayBatches
    batches = ArrayBatches(np.zeros((examples, 3)), np.zeros(examples), None, batch_size,
                           False, None)
    with pytest.raises(AutoparError, match=message):
        batches.check(3, "the 3 workers", any_of=3)
    # a last batch of 3, of 8 or of 5: a row for each worker
    for fits in (51, 48, 5):
        ArrayBatches(np.zeros((fits, 3)), np.zeros(fits), None, batch_size, False,
                     None).check(3, "the 3 workers", any_of=3)


def test_a_last_batch_that_does_not_split_into_equal_shares_is_refused_before_any_step():
    """Where every share must be equal (micro-batches): a last batch of 3
    on 2 workers (before: left out with a warning); one of 2 trains."""
    from autopar.runtime.fit_data import ArrayBatches

    def check(examples, batch_size):
        ArrayBatches(np.zeros((examples, 3)), np.zeros(examples), None, batch_size, False,
                     None).check(2, "the 2 workers")
    with pytest.raises(AutoparError, match="51 examples make a last batch of 3, which does "
                                           "not divide by the 2 workers"):
        check(51, 8)
    with pytest.raises(AutoparError, match="batch_size=9 is the global batch and must divide"):
        check(54, 9)
    check(50, 8)
    check(6, 8)


def test_a_model_that_is_not_keras_3s_is_refused():
    """A Keras 2 model (tf.keras under TF_USE_LEGACY_KERAS=1), or anything
    else that is not a keras.Model: refused, naming its class."""
    with pytest.raises(AutoparError, match="autopar.fit trains a Keras 3 model .*got a "
                                           "tensorflow.python.module.module.Module"):
        autopar.fit(tf.Module(), X, Y, epochs=1, batch_size=4, verbose=0)


@pytest.mark.parametrize("call,message", [
    (lambda m: autopar.fit(m, X, Y, use_multiprocessing=True),
     "does not take fit()'s use_multiprocessing"),
    (lambda m: autopar.fit(m, X, Y, validation_split=1.0),
     "validation_split=1.0 leaves no training or no validation examples of the 8"),
    (lambda m: autopar.fit(m, X, Y, batch_size=0), "batch_size is a positive int, got 0"),
    (lambda m: autopar.fit(m, X, Y, batch_size=4.0), "batch_size is a positive int, got 4.0"),
    (lambda m: autopar.fit(m, X, Y, validation_data=(X, Y), validation_batch_size=-1),
     "validation_batch_size is a positive int, got -1"),
    (lambda m: autopar.fit(m, X, Y, validation_freq=0),
     "validation_freq is a positive int or a list of epochs, got 0"),
    (lambda m: autopar.fit(m, X, Y, sample_weight=np.ones(8), class_weight={0: 2.0}),
     "give sample_weight or class_weight, not both"),
    (lambda m: autopar.fit(m, X, Y, sample_weight=np.ones((8, 2))),
     "sample_weight has shape (8, 2); it takes one weight per example, shape (8,)"),
    (lambda m: autopar.fit(m, {"a": X, "b": X[:5]}, Y),
     "x and y hold different numbers of examples"),
    (lambda m: autopar.fit(m, X, Y[:5]), "x and y hold different numbers of examples"),
    (lambda m: autopar.fit(m, X, [Y, Y], class_weight={0: 1.0}),
     "class_weight is for a model with one output"),
    (lambda m: autopar.fit(m, (xy for xy in [(X, Y)])), "got x: generator, y: NoneType"),
    # a dataset: its batches hold targets and weights, and every worker
    # must read the same batches
    (lambda m: autopar.fit(m, _dataset(), Y), "y is not given with a tf.data.Dataset x"),
    (lambda m: autopar.fit(m, _dataset(), batch_size=4),
     "batch_size is not given with a tf.data.Dataset x"),
    (lambda m: autopar.fit(m, _dataset().unbatch()), "the dataset x yields single examples"),
    (lambda m: autopar.fit(m, _dataset().map(lambda x, y: x)), "the dataset x yields Tensor"),
    (lambda m: autopar.fit(m, _dataset().repeat()), "the dataset x repeats forever; give its "
                                                    "steps per pass (steps_per_epoch"),
    (lambda m: autopar.fit(m, _dataset(), steps_per_epoch=2),
     "steps per pass over the dataset x, which ends"),
    (lambda m: autopar.fit(m, X, Y, steps_per_epoch=2), "steps_per_epoch is for a tf.data.Dataset"),
    (lambda m: autopar.fit(m, X, Y, validation_data=(X, Y), validation_steps=2),
     "validation_steps is for validation_data given as a tf.data.Dataset"),
    (lambda m: autopar.fit(m, _dataset().repeat(), steps_per_epoch=0),
     "the steps of the dataset x are a positive int, got 0"),
    (lambda m: autopar.fit(m, _dataset().shuffle(8)),
     "the dataset x shuffles without a seed ('ShuffleDatasetV3"),
    (lambda m: autopar.fit(m, _dataset().map(lambda x, y: (x, y), num_parallel_calls=2,
                                             deterministic=False)),
     "with deterministic=False: its order may differ between workers"),
    (lambda m: autopar.fit(m, X, Y, validation_data=_dataset().shuffle(8)),
     "validation_data shuffles without a seed"),
    # rows shuffled within each batch by an op of a map function
    (lambda m: autopar.fit(m, _dataset().map(
        lambda x, y: tuple(tf.split(tf.random.shuffle(tf.concat([x, y], 1)), [3, 1], 1)))),
     "the dataset x shuffles without a seed ('RandomShuffle', RandomShuffle, tf.random.shuffle"),
])
def test_arguments_fit_does_not_take_are_named(call, message):
    with pytest.raises(AutoparError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(_model())


def test_an_uncompiled_model_is_refused():
    import keras
    inputs = keras.Input((3,))
    with pytest.raises(AutoparError, match="compile the model first"):
        autopar.fit(keras.Model(inputs, keras.layers.Dense(1)(inputs)), X, Y)


@pytest.mark.parametrize("y", [np.array([0, 2, 1, 2]), np.array([[0], [2], [1], [2]]),
                               np.eye(3)[[0, 2, 1, 2]]], ids=["ids", "column", "one-hot"])
def test_class_weights_become_the_weights_keras_fit_gives_each_example(y):
    """Keras's own conversion is the reference: a class's weight (1 for a
    class not listed), of y's integer class or one-hot arg-max."""
    from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

    from autopar.runtime.keras_fit import _sample_weights
    class_weight = {0: 3.0, 2: 0.5}
    np.testing.assert_array_equal(_sample_weights(y, None, class_weight, "float32"),
                                  class_weight_to_sample_weights(y, class_weight))


def test_validation_data_of_another_form_is_refused():
    with pytest.raises(AutoparError, match=r"validation_data is \(x, y\), \(x, y, sample_weight\), "
                                           r"a tf.data.Dataset or a PyDataset"):
        autopar.fit(_model(), X, Y, validation_data=(X, Y, None, None))
