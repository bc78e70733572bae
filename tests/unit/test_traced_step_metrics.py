"""TensorFlow's quickstart loop under a single-device Runner: the step
hands its loss and predictions to Keras metrics and returns nothing; the
loop resets them each epoch and reads their results from Python. Before:
the metrics' Python variables never changed (the step trains the lifted
graph's copies), so every result read 0."""
import keras
import numpy as np
import pytest
import tensorflow as tf

import autopar


@pytest.fixture(autouse=True)
def _no_job(monkeypatch):
    for var in ("AUTOPAR_ROLE", "TF_CONFIG", "AUTOPAR_DEBUG"):
        monkeypatch.delenv(var, raising=False)


def _quickstart():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(3)])
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam()
    # a Mean (scalars), an accuracy, and an AUC of the arg-max class, whose
    # state is arrays
    metrics = [keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy(),
               keras.metrics.AUC(num_thresholds=5)]

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            loss = loss_object(y, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        metrics[0](loss)
        metrics[1](y, predictions)
        metrics[2](tf.one_hot(y, 3), tf.nn.softmax(predictions))
    return train_step, metrics, optimizer


def _epochs(step, metrics, batches):
    """The quickstart's loop: each epoch reset the metrics, run the steps,
    read the results."""
    results = []
    for _ in range(2):
        for m in metrics:
            m.reset_state()
        for x, y in batches:
            step(x, y)
        results.append([float(m.result()) for m in metrics])
    return results


def test_the_metrics_a_traced_step_updates_follow_it_in_python():
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(8, 6)).astype(np.float32), rng.integers(0, 3, size=8))
               for _ in range(3)]
    step, metrics, _ = _quickstart()
    expected = _epochs(step, metrics, batches)
    step, metrics, optimizer = _quickstart()
    runner = autopar.get_runner(step.get_concrete_function(
        tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int64)), None,
        autopar.Config(log_every_steps=0))
    with runner:
        got = _epochs(runner.call, metrics, batches)
        assert int(optimizer.iterations.numpy()) == 6   # the optimizer's count too
    assert all(v > 0 for v in expected[1])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
