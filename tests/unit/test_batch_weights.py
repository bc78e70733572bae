"""Which gradient seeds the workers weigh by their batches' sizes, and by
which input's leading dimension (transforms.batch_weights), found from data
flow: tf.gradients' and a GradientTape's seeds, one input per train op, not
the inner seed of a gradient penalty, nothing where the batch's size is
known in the graph. Trained on 3 workers with uneven last batches:
tests/integration/test_user_programs.py, test_keras_programs.py."""
import pytest
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.batch_weights import weighs_batches
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


def test_each_train_ops_seed_is_weighed_by_its_own_input():
    analysis = analyze_graph(_two_trainers())
    assert sorted(analysis.batch_weights.values()) == ["xa:0", "xb:0"]
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
    assert seed.startswith("gradients_1/") and analysis.batch_weights[seed] == "x:0"


def test_a_tapes_seed_in_a_traced_keras_step():
    with keras_step.keras_settings_kept():
        program = keras_step.build("emb_mlp", "adam", "float64")
        analysis = analyze_graph(lift(program.concrete).graph)
    (seed,) = analysis.batch_weights
    assert analysis.batch_weights[seed] == program.concrete.graph.inputs[0].name
    assert analysis.loss_reduction == "mean" and weighs_batches(analysis, "mean", 2, 1)


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
    assert analysis.batch_weights   # found, but
    assert not weighs_batches(analysis, analysis.loss_reduction, 3, 1)
