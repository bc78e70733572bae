"""autopar.fit's step packed into the job's plan by the process that traced
it, and taken by a worker instead of its own trace
(transforms/portable_step.py, runtime/step_graph.py): the graph, the Python
variables each lifted variable stands for, the function's inputs and outputs
and the shapes tracing inferred all as that worker's own trace gives them;
refused, so that the worker traces, where its variables are not the ones the
package names or where the step cannot travel. Twin models, built alike, stand
for the same script in two processes."""
import numpy as np
import pytest

import autopar
from autopar.runtime.step_graph import StepGraph
from autopar.transforms.compile import compile_for_config
from autopar.transforms.portable_step import NotPortable, unpack
from tests.programs import keras_step


@pytest.fixture(autouse=True)
def _keras_settings():
    with keras_step.keras_settings_kept():
        yield


def _job(width=3, optimizer="adam", lookup=False):
    """A compiled Keras model's autopar.fit, prepared (nothing traced): a
    Dense network with dropout, or with `lookup` one reading words through a
    StringLookup, whose lifted reads of its table have shapes only tracing
    knows (transforms/lift.py _with_traced_shapes)."""
    import keras
    from autopar.runtime import keras_fit
    keras.backend.clear_session()   # Keras's names as a fresh process makes them
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    if lookup:
        words = np.array([["a", "b"], ["c", "a"], ["b", "b"], ["c", "d"]] * 4)
        inputs = keras.Input((2,), dtype="string")
        ids = keras.layers.StringLookup(vocabulary=["a", "b", "c"], output_mode="one_hot")(inputs)
        h = keras.layers.Flatten()(ids)
        x = words
    else:
        inputs = keras.Input((4,))
        h = keras.layers.Dropout(0.2)(keras.layers.Dense(width)(inputs))
        x = rng.random((16, 4)).astype("float32")
    model = keras.Model(inputs, keras.layers.Dense(1)(h))
    optimizers = {"adam": lambda: keras.optimizers.Adam(0.01),
                  "loss_scale": lambda: keras.optimizers.LossScaleOptimizer(
                      keras.optimizers.SGD(0.1))}
    model.compile(optimizer=optimizers[optimizer](), loss="mse")
    y = rng.random((16, 1)).astype("float32")
    return keras_fit.prepare(model, x, y, batch_size=8, epochs=1, verbose=0)


def _packed(job):
    step = StepGraph(job.deferred_step())
    return step, step.packed_into(compile_for_config(step.graph(), 2, autopar.Config()))


@pytest.mark.slow
@pytest.mark.parametrize("lookup", [False, True], ids=["dense", "string lookup"])
def test_a_worker_takes_the_step_its_own_trace_would_make(lookup):
    traced_job = _job(lookup=lookup)
    traced, compiled = _packed(traced_job)
    assert compiled.step
    job = _job(lookup=lookup)   # the same script in a worker
    worker = StepGraph(job.deferred_step())
    graph, lifted = worker.made_from(compiled, "worker 1")
    assert worker._made is not None and lifted.graph is graph
    mine = traced.lifted()
    assert graph.as_graph_def() == mine.graph.as_graph_def()
    # every tensor's static shape, those only tracing inferred among them
    assert {t.name: t.shape.as_list() if t.shape.rank is not None else None
            for op in graph.get_operations() for t in op.outputs} == \
        {t.name: t.shape.as_list() if t.shape.rank is not None else None
         for op in mine.graph.get_operations() for t in op.outputs}
    if lookup:
        assert mine.traced_shapes
    # each lifted variable stands for the worker's own variable at the
    # traced one's place
    where = {id(v): i for i, v in enumerate(traced_job.deferred_step().variables)}
    variables = job.deferred_step().variables
    assert lifted.python_variables.keys() == mine.python_variables.keys()
    for name, variable in mine.python_variables.items():
        assert lifted.python_variables[name] is variables[where[id(variable)]]
        assert lifted.python_variables[name].name == variable.name
    assert {p: v.name for p, v in lifted.initial_values.items()} == \
        {p: v.name for p, v in mine.initial_values.items()}
    assert lifted.inputs == mine.inputs
    assert [getattr(t, "name", t) for t in lifted.outputs] == \
        [getattr(t, "name", t) for t in mine.outputs]
    compiled.check_graph(graph)


@pytest.mark.slow
def test_a_package_for_other_variables_is_not_taken_and_the_worker_traces():
    _, compiled = _packed(_job(width=3))
    job = _job(width=5)   # another model than the one packed
    with pytest.raises(NotPortable, match="sequential|dense|kernel|variable"):
        unpack(compiled.step, job.deferred_step().variables)
    worker = StepGraph(job.deferred_step())
    graph, lifted = worker.made_from(compiled, "worker 1")
    kernel = next(v for v in lifted.python_variables.values() if v.shape.as_list() == [4, 5])
    assert graph.get_operation_by_name(next(
        n for n, v in lifted.python_variables.items() if v is kernel))


@pytest.mark.slow
def test_a_step_whose_trace_builds_its_optimizer_stays_with_each_process():
    """A LossScaleOptimizer scales the loss by its initial scale until it is
    built, as Keras's traced step does: it is built by the trace, and its
    variables made there are no other process's."""
    job = _job(optimizer="loss_scale")
    assert not job.model.optimizer.built
    _, compiled = _packed(job)
    assert compiled.step is None
    assert job.model.optimizer.built


@pytest.mark.slow
def test_the_optimizer_built_before_the_trace_has_keras_fits_variables():
    """autopar.fit builds the optimizer before tracing (so that its slots
    exist where no trace runs) as Keras's fit builds it inside its traced
    step: the same variables, by the same names."""
    job = _job()
    prepared = [(v.path, v.name) for v in job.model.optimizer.variables]
    model = _job().model
    x = np.random.default_rng(0).random((16, 4)).astype("float32")
    model.fit(x, np.zeros((16, 1), "float32"), batch_size=16, epochs=1, verbose=0,
              shuffle=False)
    assert [(v.path, v.name) for v in model.optimizer.variables] == prepared
    assert len(prepared) > 2   # the iteration, the learning rate and the slots
