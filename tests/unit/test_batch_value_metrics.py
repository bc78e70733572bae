"""A model's own test_step run on each worker's rows of each validation
batch, its metrics' state summed over the workers, gives one device's
results (runtime/batch_value_metrics.py): a Mean fed the batch's loss (the
test_step of Keras's guide to customizing fit()), a Mean fed a loss summed
over the batch and one fed the batch's mean, beside one fed a value per
example, and a Sum (no count) fed the batch's mean.
The workers are simulated in this process, one after another on the same
weights, on batches that split unevenly (3 workers: 4/4/4 and 1/1/0); the
same through autopar.fit on 3 processes: tests/integration/
test_keras_programs.py::test_a_models_own_train_step_fit_as_keras_fits_it."""
import numpy as np
import pytest
import tensorflow as tf

from autopar.runtime.batch_value_metrics import OwnTestStep
from tests.programs import keras_step

WORKERS, BATCH = 3, 12


def _models():
    """Keras's guide's test_step (a Mean fed the batch's loss) and a summed
    loss's (a Mean fed the sum, one fed the examples' losses), as
    autopar.fit's test of them on 3 processes builds them."""
    import keras

    from tests.integration.scripts.keras_fit_own_step import CompiledLossModel, SummedLossModel
    built = {}
    for name, cls in (("guide", CompiledLossModel), ("summed", SummedLossModel)):
        inputs = keras.Input((4,))
        model = cls(inputs, keras.layers.Dense(1)(inputs))
        model.compile(loss="mse", metrics=["mae"] if name == "guide" else None)
        built[name] = model
    return built


def _batches(rows: int):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(rows, 4)), rng.normal(size=(rows, 1))
    return [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, rows, BATCH)]


def _results(model) -> dict[str, float]:
    return {k: float(v) for k, v in model.get_metrics_result().items()}


def _summed_over_workers(model, run) -> dict[str, float]:
    """Each worker's state after `run(w)`, summed into the metrics: their
    results."""
    states = []
    for w in range(WORKERS):
        model.reset_metrics()
        run(w)
        states.append([v.numpy() for m in model.metrics for v in m.variables])
    for v, total in zip([v for m in model.metrics for v in m.variables],
                        np.sum(states, axis=0)):
        v.assign(total)
    return _results(model)


@pytest.mark.parametrize("name", ["guide", "summed"])
def test_summed_over_workers_a_validations_metrics_are_one_devices(name):
    import keras
    with keras_step.keras_settings_kept():
        keras.config.set_floatx("float64")
        keras.config.set_dtype_policy("float64")
        model = _models()[name]
        batches = _batches(26)   # batches of 12, 12 and 2: on 3 workers 4/4/4, 4/4/4, 1/1/0
        plain = tf.function(model.test_step)
        model.reset_metrics()
        for batch in batches:
            plain(batch)
        expected = _results(model)

        def workers(step):
            def run(w):
                for x, y in batches:
                    if len(x[w::WORKERS]):
                        step((x[w::WORKERS], y[w::WORKERS]), len(x[w::WORKERS]), len(x))
            return run
        own = OwnTestStep(model)
        got = _summed_over_workers(model, workers(own))
        # Control: the plain step's state summed is not one device's
        unweighed = _summed_over_workers(model, workers(lambda data, *_: plain(data)))
    # (the summed loss's model: its Sum of the batch's mean too, not its Sum
    # of the summed loss, which adds up as it is)
    weighed = {"guide": {"loss"}, "summed": {"loss", "mean", "summean"}}[name]
    assert {m.name for m, _ in own.metrics.weighed} == weighed
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-12, err_msg=key)
    for key in weighed:
        assert not np.isclose(unweighed[key], expected[key], rtol=1e-6), key
