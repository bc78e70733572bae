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


def _fresh_keras() -> None:
    """Keras's names and settings as a fresh process running the script
    makes them: clear_session also forgets the dtype policy, which the next
    layer built then takes from floatx, whatever an earlier test of this
    process left."""
    import keras
    keras.backend.clear_session()
    keras.config.set_floatx("float32")
    keras.config.set_dtype_policy("float32")


def _job(width=3, optimizer="adam", lookup=False):
    """A compiled Keras model's autopar.fit, prepared (nothing traced): a
    Dense network with dropout, or with `lookup` one reading words through a
    StringLookup, whose lifted reads of its table have shapes only tracing
    knows (transforms/lift.py _with_traced_shapes)."""
    import keras
    from autopar.runtime import keras_fit
    _fresh_keras()
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
    assert _contents_of(graph) == _contents_of(mine.graph)
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


class _TwoOptimizers:
    """A model training by its own train_step with two optimizers it holds,
    each for half of its layers (a GAN's discriminator and generator)."""

    @staticmethod
    def model(second="sgd"):
        import keras
        import tensorflow as tf

        class Pair(keras.Model):
            def __init__(self):
                super().__init__()
                self.first, self.second = keras.layers.Dense(3), keras.layers.Dense(1)

            def call(self, x):
                return self.second(self.first(x))

            def compile(self, first_optimizer, second_optimizer):
                super().compile()
                self.first_optimizer, self.second_optimizer = first_optimizer, second_optimizer

            def train_step(self, data):
                x, y = data
                with tf.GradientTape(persistent=True) as tape:
                    loss = tf.reduce_mean((self(x) - y) ** 2)
                for optimizer, layer in ((self.first_optimizer, self.first),
                                         (self.second_optimizer, self.second)):
                    grads = tape.gradient(loss, layer.trainable_weights)
                    optimizer.apply_gradients(zip(grads, layer.trainable_weights))
                return {"loss": loss}

        model = Pair()
        model(np.zeros((1, 4), "float32"))
        model.compile(keras.optimizers.Adam(0.01),
                      keras.optimizers.Adam(0.02) if second == "adam"
                      else keras.optimizers.SGD(0.1, momentum=0.9))
        return model


def _fit_job(model):
    from autopar.runtime import keras_fit
    rng = np.random.default_rng(0)
    return keras_fit.prepare(model, rng.random((16, 4)).astype("float32"),
                             rng.random((16, 1)).astype("float32"), batch_size=8, epochs=1,
                             verbose=0)


def _two_optimizers_job(second="sgd"):
    _fresh_keras()
    return _fit_job(_TwoOptimizers.model(second))


@pytest.mark.slow
@pytest.mark.parametrize("make", [lambda: _job(), lambda: _job(optimizer="loss_scale"),
                                  _two_optimizers_job, lambda: _two_optimizers_job("adam")],
                         ids=["compiled adam", "compiled LossScaleOptimizer", "own step",
                              "own step, two Adams"])
def test_the_optimizers_the_trace_builds_are_built_alike_by_a_worker(make):
    """Keras builds an optimizer in its first apply_gradients, inside the
    traced step (a LossScaleOptimizer scales the loss by its initial scale
    until then, in the trace): a worker taking the graph builds its own for
    the variables at the same places, in the same name scope, so that each
    holds the same variables by the same names (Keras's paths: a trace
    makes TensorFlow's names of a second Adam's slots unique in its graph,
    "adam_1_1/...", where a build outside it keeps "adam_1/...")."""
    traced_job = make()
    assert not any(o.built for o in _optimizers(traced_job.model))
    traced, compiled = _packed(traced_job)
    assert compiled.step
    # packed alike again (a launcher compiles the plan again for a restart)
    assert _contents(traced.packed_into(compiled).step) == _contents(compiled.step)
    job = make()
    graph, lifted = StepGraph(job.deferred_step()).made_from(compiled, "worker 1")
    assert _contents_of(graph) == _contents_of(traced.graph())
    # (an own step's model compiled without one has an RMSprop it never uses)
    built = [o.built for o in _optimizers(traced_job.model)]
    assert [o.built for o in _optimizers(job.model)] == built
    assert built.count(True) == (2 if "Pair" in type(job.model).__name__ else 1)
    for mine, theirs in zip(_optimizers(job.model), _optimizers(traced_job.model)):
        assert [(v.path, v.name, v.shape) for v in mine.variables] == \
            [(v.path, v.name, v.shape) for v in theirs.variables]
        assert len(mine.variables) > 2 or not mine.built   # the slots, the iteration, the rate
    slots = {v.value.name for o in _optimizers(job.model) for v in o.variables}
    assert {v.name for v in lifted.python_variables.values()} >= \
        {n for n in slots if "iteration" not in n and "learning_rate" not in n} - {""}
    for name, variable in lifted.python_variables.items():
        assert any(variable is v.value for o in _optimizers(job.model) for v in o.variables) \
            or any(variable is v.value for v in job.model.variables + job.model.metrics_variables)


def _contents_of(graph) -> tuple:
    return _graph_contents(graph.as_graph_def())


def _graph_contents(graph_def) -> tuple:
    """A GraphDef's nodes, in order, and its library's functions by name
    (TensorFlow lists a GraphDef's functions in its own hash order)."""
    return (list(graph_def.node), {f.signature.name: f for f in graph_def.library.function},
            list(graph_def.library.gradient))


def _contents(text: str) -> dict:
    """A package's contents, its graph as _graph_contents."""
    import base64
    import json
    import zlib

    import tensorflow as tf
    data = json.loads(text)
    meta = tf.compat.v1.MetaGraphDef()
    meta.ParseFromString(zlib.decompress(base64.b64decode(data.pop("meta_graph"))))
    return {**data, "graph": _graph_contents(meta.graph_def)}


def _optimizers(model):
    from autopar.runtime.fit_step_variables import StepVariables
    return StepVariables(model).optimizers


@pytest.mark.slow
def test_a_step_whose_trace_makes_other_variables_is_traced_by_every_process():
    """A variable the trace makes that no optimizer's build makes (a metric
    the step creates on its first call) is no variable a worker could
    stand it for: the plan carries no step."""
    import keras
    import tensorflow as tf
    _fresh_keras()

    class Lazy(keras.Model):
        def train_step(self, data):
            x, y = data
            if not hasattr(self, "seen"):
                self.seen = tf.Variable(0.0, trainable=False, name="seen")
            self.seen.assign_add(1.0)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((self(x) - y) ** 2)
            grads = tape.gradient(loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            return {"loss": loss}

    inputs = keras.Input((4,))
    model = Lazy(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    _, compiled = _packed(_fit_job(model))
    assert compiled.step is None
