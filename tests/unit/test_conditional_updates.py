"""Updates that run under a condition: Keras's LossScaleOptimizer (the
"mixed_float16" policy's) applies them only when every gradient is finite,
inside a tf.cond. Traced, that cond is an If whose branches are functions;
lifting lowers it into the graph as Switch/Merge (transforms.lower_cond),
and the analysis keeps conditionally updated variables off the servers,
whose protocol applies an update every step. A tf.compat.v1 graph built
with control flow v1 has the Switch/Merge form from the start."""
import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.lift import CALL_OP, lift
from autopar.transforms.lower_cond import lower_conds, lowered_graph
from tests.programs import keras_step

tf1 = tf.compat.v1


@pytest.fixture(autouse=True)
def _keras_settings():
    with keras_step.keras_settings_kept():
        yield


def _run_lifted(program, steps):
    """The variables after `steps` calls of the lifted step in a Session."""
    lifted = lift(program.concrete)
    graph, cf = lifted.graph, program.concrete
    with graph.as_default():
        init = tf1.global_variables_initializer()
    session = tf1.Session(graph=graph)
    session.run(init, lifted.initial_feed())
    for k in range(steps):
        x, y = program.batch(k, 6)
        session.run(CALL_OP, {cf.graph.inputs[0].name: x, cf.graph.inputs[1].name: y})
    return lifted, {name: session.run(name + "/Read/ReadVariableOp:0")
                    for name in lifted.python_variables}


def test_a_loss_scaled_step_lowered_runs_as_the_function_runs():
    """Both branches taken (four finite steps, the scale grown twice in the
    nested cond, to inf; a fifth whose gradients are not finite), every
    variable equal to five calls of the tf.function itself. float64: the
    lowered graph's kernels may round float32 differently in the last bit."""
    program = keras_step.build("emb_mlp", "lossscale", "float64")
    lifted, values = _run_lifted(program, 5)
    types = {op.type for op in lifted.graph.get_operations()}
    assert "If" not in types and {"Switch", "Merge"} <= types
    for k in range(5):
        program.train_step(*program.batch(k, 6))
    for name, variable in lifted.python_variables.items():
        np.testing.assert_allclose(values[name], variable.numpy(), rtol=1e-12, atol=1e-15,
                                   err_msg=name)
    assert program.optimizer.inner_optimizer.iterations.numpy() == 4   # one step skipped


def test_the_analysis_finds_every_conditional_update_and_keeps_it_off_the_servers():
    program = keras_step.build("emb_mlp", "lossscale", "float32")
    analysis = analyze_graph(lift(program.concrete).graph)
    assert {v.name for v in analysis.variables} == {
        v.path for v in program.model.trainable_variables}
    for info in analysis.variables:
        if info.name.endswith("embeddings"):   # Adam squares its rows first
            continue
        assert "runs only when" in info.ps_blocker and "(Switch)" in info.ps_blocker, info.name
    state = {s.name.rsplit("/", 1)[-1] for s in analysis.state}
    assert {"dynamic_scale", "step_counter"} <= state


def test_a_cond_that_writes_nothing_stays_one_op():
    """A model's own forward tf.cond is no update: the GraphDef is returned
    as it was."""
    w = tf.Variable(np.ones((3, 1)), name="w")

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            h = tf.cond(tf.reduce_sum(x) > 0, lambda: tf.matmul(x, w), lambda: -tf.matmul(x, w))
            loss = tf.reduce_mean(h * h)
        w.assign_sub(0.1 * tape.gradient(loss, w))
        return loss

    graph_def = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float64)).graph.as_graph_def()
    assert any(n.op in ("If", "StatelessIf") for n in graph_def.node)
    assert lower_conds(graph_def) is graph_def


def test_an_update_inside_a_loop_is_refused_naming_it():
    """A loop's body is not lowered: updates applied inside one are refused,
    naming the loop."""
    import keras
    program = keras_step.build("emb_mlp", "sgd", "float64")
    model, loss_fn = program.model, keras.losses.MeanSquaredError()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        for _ in tf.range(2):
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    concrete = step.get_concrete_function(tf.TensorSpec([None, keras_step.IDS], tf.int32),
                                          tf.TensorSpec([None, 1], tf.float64))
    with pytest.raises(UnsupportedGraphError,
                       match=r"The gradients reach '[^']+' \((Stateless)?While\), which runs a "
                             r"function body"):
        analyze_graph(lift(concrete).graph)


def _tf1_loss_scaled(control_flow_v2: bool):
    """A tf.compat.v1 graph trained by MixedPrecisionLossScaleOptimizer
    (Adam) from a loss scale of 2**125 that doubles after 2 finite steps:
    (graph, train op, x)."""
    if not control_flow_v2:
        tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            w = tf1.get_variable("w", [4, 1], tf.float32, tf1.ones_initializer())
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
            opt = tf1.mixed_precision.MixedPrecisionLossScaleOptimizer(
                tf1.train.AdamOptimizer(0.01),
                tf1.mixed_precision.DynamicLossScale(2.0 ** 125, increment_period=2))
            train = opt.minimize(loss)
    finally:
        tf1.enable_control_flow_v2()
    return graph, train, x


def _trained(graph, train, x, steps=6):
    """{variable: value} after `steps` runs of `train` (by name) in a Session
    of `graph`."""
    with graph.as_default():
        init = tf1.global_variables_initializer()
        variables = tf1.global_variables()
    session = tf1.Session(graph=graph)
    session.run(init)
    rng = np.random.default_rng(5)
    for _ in range(steps):
        session.run(train.name, {x.name: rng.normal(size=(6, 4))})
    return session.run({v.op.name: v for v in variables})


def test_a_tf1_loss_scale_optimizer_in_control_flow_v1_stays_off_the_servers():
    """tf.compat.v1's MixedPrecisionLossScaleOptimizer with control flow v1:
    the update of w under the cond's Switch (before, ps placed it on a
    server and the worker's graph had a cycle)."""
    graph, _, _ = _tf1_loss_scaled(control_flow_v2=False)
    (info,) = analyze_graph(graph).variables
    assert info.name == "w"
    assert "runs only when" in info.ps_blocker and "(Switch)" in info.ps_blocker


def test_a_tf1_graph_in_control_flow_v2_is_lowered_and_runs_as_before():
    """The same optimizer in control flow v2 (TensorFlow 2's default): its
    conds are If ops (before: refused). The lowered copy keeps every name
    and collection, and runs as the graph itself: equal after six steps
    with both branches taken (at 2**127, after the scale's second doubling,
    the scaled gradients overflow float32: a step is skipped)."""
    graph, train, x = _tf1_loss_scaled(control_flow_v2=True)
    assert any(op.type == "If" for op in graph.get_operations())
    lowered = lowered_graph(graph)
    assert lowered is not graph and not any(op.type == "If" for op in lowered.get_operations())
    assert ([v.op.name for v in lowered.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)]
            == ["w"])
    expected, got = _trained(graph, train, x), _trained(lowered, train, x)
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
    (beta1_power,) = [v for k, v in expected.items() if k.endswith("beta1_power")]
    applied = round(np.log(beta1_power) / np.log(0.9)) - 1
    assert 0 < applied < 6
    (info,) = analyze_graph(lowered).variables
    assert "runs only when" in info.ps_blocker


@pytest.mark.slow
def test_fit_scales_the_loss_as_keras_fit_does():
    """autopar.fit under the "mixed_float16" policy: compile wraps the
    optimizer in a LossScaleOptimizer, which unscales the gradients;
    autopar.fit's step scales the loss first, as Keras's own step does
    (before, every gradient reached Adam divided by the scale, 32768).
    One device, against Keras's model.fit; float16 arithmetic, and the
    two steps' graphs differ, so equal to float16's rounding."""
    import keras
    keras.mixed_precision.set_global_policy("mixed_float16")
    rng = np.random.default_rng(0)
    x = rng.integers(0, 30, size=(48, 4)).astype(np.int32)
    y = rng.integers(0, 3, size=(48,)).astype(np.int32)

    def trained(fit):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((4,), dtype="int32")
        h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(30, 6)(inputs))
        h = keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(h))
        model = keras.Model(inputs, keras.layers.Activation("softmax", dtype="float32")(h))
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
        assert type(model.optimizer).__name__ == "LossScaleOptimizer"
        fit(model)
        return [(v.path, v.numpy()) for v in model.variables + model.optimizer.variables]

    kwargs = dict(epochs=2, batch_size=12, shuffle=False, verbose=0)
    expected = trained(lambda m: m.fit(x, y, **kwargs))
    got = trained(lambda m: autopar.fit(m, x, y, config=autopar.Config(log_every_steps=0),
                                        **kwargs))
    for (name, value), (_, actual) in zip(expected, got, strict=True):
        # Adam's moments: of a gradient / 32768 they would be 4 and 9 orders smaller
        np.testing.assert_allclose(actual, value, rtol=0.02, atol=1e-4 * np.abs(value).max(),
                                   err_msg=name)
