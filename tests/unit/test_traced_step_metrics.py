"""TensorFlow's quickstart loop under a single-device Runner: the step
hands its loss and predictions to Keras metrics and returns nothing; the
loop resets them each epoch and reads their results from Python. Before:
the metrics' Python variables never changed (the step trains the lifted
graph's copies), so every result read 0."""
import numpy as np
import pytest
import tensorflow as tf

import autopar
from tests.programs import quickstart


@pytest.fixture(autouse=True)
def _no_job(monkeypatch):
    for var in ("AUTOPAR_ROLE", "TF_CONFIG", "AUTOPAR_DEBUG"):
        monkeypatch.delenv(var, raising=False)


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
    batches = quickstart.batches(3, 8)
    step, metrics, _ = quickstart.build()
    expected = _epochs(step, metrics, batches)
    step, metrics, optimizer = quickstart.build()
    runner = autopar.get_runner(step.get_concrete_function(
        tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int64)), None,
        autopar.Config(log_every_steps=0))
    with runner:
        got = _epochs(runner.call, metrics, batches)
        assert int(optimizer.iterations.numpy()) == 6   # the optimizer's count too
    assert all(v > 0 for v in expected[1])
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_the_steps_python_variables_fetch_their_trained_values():
    """runner.run of a Keras 3 variable the step captures (or of the
    tf.Variable it holds) gives the trained value the runner's graph holds,
    as eager training would leave it (before: a Keras variable was looked up
    by its name in the graph, a KeyError)."""
    batches = quickstart.batches(3, 8)
    step, _, optimizer = quickstart.build()
    for x, y in batches:
        step(x, y)
    expected = [v.numpy() for v in optimizer.variables]
    step, _, optimizer = quickstart.build()
    runner = autopar.get_runner(step.get_concrete_function(
        tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int64)), None,
        autopar.Config(log_every_steps=0))
    with runner:
        for x, y in batches:
            runner.call(x, y)
        got = runner.run(list(optimizer.variables))
        held = runner.run([v.value for v in optimizer.variables])
    assert len(got) == len(expected) > 2 and int(got[0]) == 3   # the iteration count first
    for g, h, e in zip(got, held, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)
        np.testing.assert_array_equal(g, h)


@pytest.mark.slow
def test_a_reset_from_python_is_not_undone_by_a_sync():
    """keras-io's custom-loop guide's epoch: read the training metric,
    reset it in Python, then read the trained weights for validation
    (runner.sync_python_variables()). Before: the sync copied the graph's
    metric state back over the reset, and the next epoch's result counted
    both epochs; the reset goes into the graph first now, and each epoch's
    result is its own."""
    batches = quickstart.batches(4, 8)
    step, metrics, _ = quickstart.build()
    expected = []
    for epoch in range(2):
        for x, y in batches[2 * epoch:2 * epoch + 2]:
            step(x, y)
        expected.append([float(m.result()) for m in metrics])
        for m in metrics:
            m.reset_state()
    step, metrics, _ = quickstart.build()
    runner = autopar.get_runner(step.get_concrete_function(
        tf.TensorSpec([None, 6]), tf.TensorSpec([None], tf.int64)), None,
        autopar.Config(log_every_steps=0))
    got = []
    with runner:
        for epoch in range(2):
            for x, y in batches[2 * epoch:2 * epoch + 2]:
                runner.call(x, y)
            got.append([float(m.result()) for m in metrics])
            for m in metrics:
                m.reset_state()
            runner.sync_python_variables()
            assert all(float(m.result()) == 0 for m in metrics)
    np.testing.assert_allclose(got, expected, rtol=1e-6)
