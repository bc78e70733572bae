"""Which gradient seeds the workers weigh by their batches' sizes, and by
which tensor's leading dimension (transforms.batch_weights: what the loss's
mean reduces), found from data flow: tf.gradients' and a GradientTape's
seeds, each train op's own, not the inner seed of a gradient penalty, not a
flat list of ids read before the batch, nothing where the batch's size is
known in the graph. Trained on 3 workers with uneven last batches:
tests/integration/test_user_programs.py, test_keras_programs.py."""
import pytest
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.batch_weights import weighs_batches
from autopar.transforms.graph_utils import INPUT_OP_TYPES
from autopar.transforms.lift import lift
from tests.programs import keras_step

tf1 = tf.compat.v1


def _two_trainers(batch=None):
    """Two optimizers, each on a loss of its own placeholders."""
    graph = tf.Graph()
    with graph.as_default():
        xa = tf1.placeholder(tf.float32, [batch, 3], name="xa")
        xb = tf1.placeholder(tf.float32, [batch, 3], name="xb")
        wa = tf1.get_variable("wa", [3, 1])
        wb = tf1.get_variable("wb", [3, 1])
        loss_a = tf.reduce_mean(tf.square(tf.matmul(xa, wa)))
        loss_b = tf.reduce_mean(tf.square(tf.matmul(xb, wb)))
        train_a = tf1.train.GradientDescentOptimizer(0.1).minimize(loss_a)
        train_b = tf1.train.GradientDescentOptimizer(0.1).minimize(loss_b)
        tf1.add_to_collection("train", train_a)
        tf1.add_to_collection("train", train_b)
    return graph


def test_each_train_ops_seed_is_weighed_by_its_own_batch():
    analysis = analyze_graph(_two_trainers())
    # the per-example squares each loss averages
    assert sorted(analysis.batch_weights.values()) == ["Square:0", "Square_1:0"]
    assert all(seed.split("/")[-1].startswith("grad_ys") for seed in analysis.batch_weights)
    assert weighs_batches(analysis, "mean", 3, 1)
    # one worker, a summed loss, micro-batches: nothing to weigh
    assert not weighs_batches(analysis, "mean", 1, 1)
    assert not weighs_batches(analysis, "sum", 3, 1)
    assert not weighs_batches(analysis, "mean", 3, 2)


def test_a_batch_of_known_size_is_not_weighed():
    assert analyze_graph(_two_trainers(batch=4)).batch_weights == {}


def test_a_gradient_penalty_seed_is_part_of_the_forward_pass():
    """A loss with a gradient penalty (WGAN-GP's, TF1): the inner
    tf.gradients' seed is computed before the loss, so it is not weighed;
    the outer one is. The train op's loss is the outer target (before: the
    inner one, whose reduction over the batch showed nothing)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 1])
        out = tf.matmul(tf.tanh(x), w)
        (grad_x,) = tf.gradients(out, [x])   # scope "gradients"
        loss = tf.reduce_mean(out) + tf.reduce_mean(tf.square(tf.norm(grad_x, axis=1) - 1.0))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze_graph(graph)
    assert analysis.loss == loss.name and analysis.loss_reduction == "mean"
    (seed,) = analysis.batch_weights
    assert seed.startswith("gradients_1/") and analysis.batch_weights[seed] == out.name


def test_a_tapes_seed_in_a_traced_keras_step():
    with keras_step.keras_settings_kept():
        program = keras_step.build("emb_mlp", "adam", "float64")
        lifted = lift(program.concrete)
        analysis = analyze_graph(lifted.graph)
    (seed,) = analysis.batch_weights
    # the per-example errors Keras's loss sums, then divides by their count
    values = lifted.graph.get_tensor_by_name(analysis.batch_weights[seed])
    assert values.shape.as_list() == [None] and values.op.type not in INPUT_OP_TYPES
    assert analysis.loss_reduction == "mean" and weighs_batches(analysis, "mean", 2, 1)


def test_a_flat_list_of_ids_is_not_the_batch():
    """Bags of a variable number of ids per example, fed flat and read
    before the labels: the batch is what the mean over the examples
    reduces, not the ids' count (which differs between workers of equal
    batches)."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [None], name="ids")
        segments = tf1.placeholder(tf.int32, [None], name="segments")
        y = tf1.placeholder(tf.int32, [None], name="y")
        emb = tf1.get_variable("emb", [10, 3])
        bags = tf.math.unsorted_segment_sum(tf.nn.embedding_lookup(emb, ids), segments,
                                            tf.shape(y)[0])
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=bags)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(per_example))
    analysis = analyze_graph(graph)
    assert list(analysis.batch_weights.values()) == [per_example.name]


@pytest.mark.parametrize("reduce", ["sum", "count"])
def test_no_weights_where_the_combination_is_exact_already(reduce):
    """A summed loss (workers' sums add up) and a loss divided by a count of
    the batch's values (transforms.loss_counts) combine exactly whatever the
    sizes."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        mask = tf1.placeholder(tf.float32, [None], name="mask")
        w = tf1.get_variable("w", [3, 1])
        per_example = tf.reshape(tf.square(tf.matmul(x, w)), [-1]) * mask
        loss = (tf.reduce_sum(per_example) if reduce == "sum"
                else tf.reduce_sum(per_example) / tf.reduce_sum(mask))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze_graph(graph)
    assert analysis.loss_reduction == ("sum" if reduce == "sum" else "mean")
    assert not weighs_batches(analysis, analysis.loss_reduction, 3, 1)


def _metric_updates(batch=None):
    """A loss averaged over the batch and four additions to state of the
    step's own, as Keras metrics make them: a Mean fed the loss (Keras 3's
    `total.assign(total + x)`, and an AssignAdd), its count's 1, and an
    accuracy-like sum over the batch."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [batch, 3], name="x")
        w = tf1.get_variable("w", [3, 1], use_resource=True)
        per_example = tf.square(tf.matmul(x, w), name="per_example")
        loss = tf.reduce_mean(per_example)
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)

        def state(name):
            return tf1.get_variable(name, [], trainable=False, use_resource=True,
                                    initializer=tf1.zeros_initializer())
        total, added, count, matches = (state(n) for n in ("total", "added", "count", "matches"))
        with tf.control_dependencies([train]):
            updates = [total.assign(total + loss, name="total_update"),
                       added.assign_add(2.0 * loss, name="added_update"),
                       count.assign_add(1.0, name="count_update"),
                       matches.assign(matches + tf.reduce_sum(per_example),
                                      name="matches_update")]
        tf1.add_to_collection("train", tf.group(train, *updates))
    return graph


def test_what_a_step_adds_of_its_batchs_mean_is_weighed():
    graph = _metric_updates()
    analysis = analyze_graph(graph)
    increments = analysis.batch_mean_increments
    # the Add of `total + loss` (the loss's other readers keep it unweighed), the
    # AssignAdd; not the count's constant, not a sum over the batch (which
    # adds up over workers already)
    by_variable = {v: (op, added) for op, (v, added, _) in increments.items()}
    assert sorted(by_variable) == ["added", "total"], increments
    assert graph.get_operation_by_name(by_variable["total"][0]).type in ("Add", "AddV2")
    assert graph.get_operation_by_name(by_variable["added"][0]).type == "AssignAddVariableOp"
    assert {batch for _, _, batch in increments.values()} == {"per_example:0"}
    assert graph.get_tensor_by_name(by_variable["total"][1]).op.type == "Mean"


def test_nothing_is_weighed_where_the_batch_has_a_size_in_the_graph():
    analysis = analyze_graph(_metric_updates(batch=4))
    assert analysis.batch_mean_increments == {} and analysis.batch_weights == {}


def test_a_tensor_computed_from_variables_alone():
    """What autopar.fit needs to tell that a step's log is a metric's result
    (runtime/step/graph_queries.py): the variables alone it is computed from."""
    from autopar.runtime.step.graph_queries import variables_computed_from
    graph = tf.Graph()
    with graph.as_default():
        total = tf1.get_variable("total", [], use_resource=True)
        count = tf1.get_variable("count", [], use_resource=True)
        x = tf1.placeholder(tf.float32, [None], name="x")
        result = tf.math.divide_no_nan(total.read_value(), count.read_value())
        assert variables_computed_from(result) == {"total", "count"}
        assert variables_computed_from(result + tf.reduce_mean(x)) is None
        assert variables_computed_from(result * tf.random.uniform([])) is None
        assert variables_computed_from(tf.constant(1.0)) is None


def test_an_addition_outside_the_training_step_is_not_weighed():
    """An evaluation's Mean of the loss (its update run apart from the
    training step, by workers that need not run as many): weighing it would
    run the weight's all-reduce in each evaluation run."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 1], use_resource=True)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        tf1.add_to_collection("train", tf1.train.GradientDescentOptimizer(0.1).minimize(loss))
        total = tf1.get_variable("eval_total", [], trainable=False, use_resource=True,
                                 initializer=tf1.zeros_initializer())
        total.assign_add(loss, name="eval_update")
    analysis = analyze_graph(graph)
    assert analysis.batch_weights and analysis.batch_mean_increments == {}


def test_a_traced_steps_mean_of_its_loss_is_weighed_and_its_accuracy_is_not():
    """TensorFlow's quickstart step (tests/programs/quickstart.py): a Mean
    fed the loss, an accuracy and an AUC updated after the optimizer, which
    TensorFlow orders per variable only (no successor of the backward pass):
    a lifted function's ops run in its calls alone, training steps."""
    from tests.programs import quickstart
    with keras_step.keras_settings_kept():
        train_step, metrics, _ = quickstart.build("float64")
        concrete = train_step.get_concrete_function(
            tf.TensorSpec([None, quickstart.FEATURES], tf.float64), tf.TensorSpec([None], tf.int64))
        lifted = lift(concrete)
        analysis = analyze_graph(lifted.graph)
    weighed = {v for v, _, _ in analysis.batch_mean_increments.values()}
    mean_total = lifted.graph.get_operation_by_name(
        next(name for name, v in lifted.python_variables.items()
             if v is metrics[0].variables[0] or v is getattr(metrics[0].variables[0], "value", None)))
    assert weighed == {mean_total.name}, analysis.batch_mean_increments


def _traced_trackers(reduce):
    """A traced Keras 3 step trained on a loss reduced over the batch by
    `reduce`, feeding Keras metrics: the loss (one value), the examples'
    losses (a value per example), the loss into a Sum metric (no count), a
    constant, the examples' mean; (its lifted graph, {metric name: the
    lifted name of its total})."""
    import keras
    with keras_step.keras_settings_kept():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.1)
        metrics = {"loss": keras.metrics.Mean(name="loss"),
                   "examples": keras.metrics.Mean(name="examples"),
                   "summed": keras.metrics.Sum(name="summed"),
                   "constant": keras.metrics.Mean(name="constant"),
                   "mean": keras.metrics.Mean(name="mean")}

        @tf.function
        def step(x, y):
            with tf.GradientTape() as tape:
                per_example = tf.square(y - model(x))[:, 0]
                loss = reduce(per_example)
            optimizer.apply(tape.gradient(loss, model.trainable_variables),
                            model.trainable_variables)
            metrics["loss"].update_state(loss)
            metrics["examples"].update_state(per_example)
            metrics["summed"].update_state(loss)
            metrics["constant"].update_state(2.0)
            metrics["mean"].update_state(tf.reduce_mean(per_example))
            return {name: m.result() for name, m in metrics.items()}
        lifted = lift(step.get_concrete_function(tf.TensorSpec([None, 3], tf.float32),
                                                 tf.TensorSpec([None, 1], tf.float32)))
    totals = {}
    for name, metric in metrics.items():
        held = {id(metric.total), id(getattr(metric.total, "value", None))}
        totals[name] = next(n for n, v in lifted.python_variables.items() if id(v) in held)
    return lifted, totals


def test_a_mean_fed_a_sum_over_the_batch_is_weighed_by_the_workers_count():
    """Its total adds up over workers, its count (1 per step each) does not:
    the total weighed by N. Not a Mean fed the examples' values (its count
    grows by their number, which adds up), not a Sum metric (no count), not
    a constant."""
    lifted, totals = _traced_trackers(tf.reduce_sum)
    analysis = analyze_graph(lifted.graph)
    assert {v for v, _ in analysis.batch_sum_increments.values()} == {totals["loss"]}, \
        (analysis.batch_sum_increments, totals)
    # a mean over the batch is weighed by N * b / B whatever the loss
    assert analysis.batch_weights == {}
    assert {v for v, _, _ in analysis.batch_mean_increments.values()} == {totals["mean"]}
    # weighed by N in the rewritten graph, with no all-reduce
    from autopar.transforms.batch_weights import rewrite_batch_weights
    graph = lifted.graph
    with graph.as_default():
        rewire, _, inputs = rewrite_batch_weights(graph, {}, None, None, 3, {},
                                                  analysis.batch_sum_increments)
    assert rewire == {} and len(inputs) == 1
    (replaced,) = inputs.values()
    (weighed,) = replaced.values()
    weighed = graph.get_tensor_by_name(weighed if ":" in weighed else weighed + ":0")
    assert weighed.op.type == "Mul" and tf.get_static_value(weighed.op.inputs[1]) == 3.0


def test_a_mean_fed_the_batchs_mean_is_no_sum():
    lifted, totals = _traced_trackers(tf.reduce_mean)
    analysis = analyze_graph(lifted.graph)
    assert analysis.batch_sum_increments == {}
    weighed = {v for v, _, _ in analysis.batch_mean_increments.values()}
    assert {totals["loss"], totals["mean"]} <= weighed and totals["examples"] not in weighed
    # the Sum fed the batch's mean: a total no count divides, weighed by b / B
    # (the others by N * b / B, as their counts grow N per step)
    assert {analysis.batch_mean_increments[op][0] for op in analysis.batch_mean_totals} == \
        {totals["summed"]}


def _transposed_mean(reduce):
    """A loss averaging over the batch along axis 1 of the transposed
    squared errors [classes, b], as `reduce` writes it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, 5], name="x")
        y = tf1.placeholder(tf.int64, [None], name="y")
        w = tf1.get_variable("w", [5, 4], tf.float64,
                             initializer=tf1.glorot_uniform_initializer(seed=1))
        errors = tf.transpose(tf.square(tf.nn.softmax(tf.matmul(x, w))
                                        - tf.one_hot(y, 4, dtype=tf.float64)))
        train = tf1.train.GradientDescentOptimizer(0.5).minimize(reduce(errors))
    return graph, train


@pytest.mark.slow
@pytest.mark.parametrize("reduce,batch_tensor", [
    # the per-class means over the batch, summed over the classes: the
    # batch along axis 1 of what the mean reduces, so counted in the input's
    (lambda errors: tf.reduce_sum(tf.reduce_mean(errors, axis=1)), "x:0"),
    # each example's errors summed over the classes, averaged over the batch
    (lambda errors: tf.reduce_mean(tf.reduce_sum(errors, axis=0)), "Sum:0"),
], ids=["sum of batch means", "mean of class sums"])
def test_a_mean_along_another_axis_is_weighed_by_the_batch(reduce, batch_tensor):
    """The examples' forms say which axis a mean over the batch runs along:
    the workers weigh their gradients by their shares of an 11-example
    global batch (4/4/3 on 3 workers) and end with one device's variable
    after 4 steps (before: the first read as no mean, the second as a mean
    of the classes, and neither weighed: parameters off by up to 0.02)."""
    import numpy as np

    from autopar.transforms.plan import PlanOptions, make_plan
    from autopar.transforms.rewrite import rewrite_for_worker
    from tests.unit.local_run import run_locally, run_workers_together
    graph, train = _transposed_mean(reduce)
    analysis = analyze_graph(graph)
    assert analysis.loss_reduction == "mean"
    assert list(analysis.batch_weights.values()) == [batch_tensor]
    n, rng = 3, np.random.default_rng(0)
    batches = [(rng.normal(size=(11, 5)), rng.integers(0, 4, size=11)) for _ in range(4)]
    plan = make_plan(analysis, n, options=PlanOptions(run_option="allreduce"))
    rewritten = [rewrite_for_worker(graph, analysis, plan, w) for w in range(n)]

    def train_together(session):
        for x, y in batches:
            session.run([f"w{w}/{train.name}" for w in range(n)],
                        {**{f"w{w}/x:0": x[w::n] for w in range(n)},
                         **{f"w{w}/y:0": y[w::n] for w in range(n)}})
        return session.run([f"w{w}/w/Read/ReadVariableOp:0" for w in range(n)])

    def train_alone(session):
        for x, y in batches:
            session.run(train.name, {"x:0": x, "y:0": y})
        return session.run("w/Read/ReadVariableOp:0")
    expected = run_locally(graph.as_graph_def(), train_alone)
    for w, value in enumerate(run_workers_together(rewritten, train_together)):
        np.testing.assert_allclose(value, expected, rtol=1e-12, err_msg=f"worker {w}")
