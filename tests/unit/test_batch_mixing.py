"""Losses that mix the examples of a batch (transforms/batch_mixing.py): found
from data flow and reported, where a loss of each example alone, batch
normalisation (recognised) and the losses' own reductions are not."""
import keras
import pytest
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.lift import lift
from autopar.transforms.plan import make_plan
from autopar.transforms.report import build_report
from tests import models

tf1 = tf.compat.v1
F = 5


def _dual_encoder(kind: str) -> tf.Graph:
    """Queries x and keys y, each through its own weights, into a loss of
    `kind`."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, F], name="x")
        y = tf1.placeholder(tf.float64, [None, F], name="y")
        q = tf.matmul(x, tf1.get_variable("wq", [F, 4], tf.float64), name="q")
        k = tf.matmul(y, tf1.get_variable("wk", [F, 4], tf.float64), name="k")
        if kind == "in_batch_negatives":   # every query against every key of the batch
            logits = tf.matmul(q, k, transpose_b=True, name="similarity")
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.range(tf.shape(x)[0]), logits=logits))
        elif kind == "centred":            # each query less the batch's mean query
            centred = q - tf.reduce_mean(q, axis=0, keepdims=True, name="batch_mean")
            loss = tf.reduce_mean(tf.square(centred - k))
        elif kind == "normalised_over_batch":
            loss = tf.reduce_mean(tf.square(tf.nn.l2_normalize(q, axis=0) - k))
        elif kind == "hardest_half":       # the loss of the batch's hardest examples
            per = tf.reduce_sum(tf.square(q - k), axis=1)
            hardest, _ = tf.nn.top_k(per, k=tf.shape(per)[0] // 2, name="hardest")
            loss = tf.reduce_mean(hardest)
        elif kind == "per_example":        # a mean and a masked mean of each example's losses
            per = tf.reduce_sum(tf.square(q - k), axis=1)
            mask = tf.cast(tf.reduce_sum(x, axis=1) > 0, tf.float64)
            loss = (tf.reduce_mean(per)
                    + tf.reduce_sum(per * mask) / tf.maximum(tf.reduce_sum(mask), 1.0))
        elif kind == "time_major":         # [time, batch, features]: axis 0 is time
            seq = tf1.placeholder(tf.float64, [None, None, F], name="seq")
            h = tf.reduce_mean(tf.tensordot(seq, tf1.get_variable("wt", [F, 4], tf.float64), 1),
                               axis=0)
            loss = tf.reduce_mean(tf.square(h - k))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


@pytest.mark.parametrize("kind,found", [
    ("in_batch_negatives", ["similarity"]),
    ("centred", ["batch_mean"]),
    ("normalised_over_batch", ["l2_normalize/Sum"]),
    ("hardest_half", ["hardest"]),
    ("per_example", []),
    # a reduction keeping a first dimension of unknown size may be over time
    ("time_major", []),
])
def test_ops_mixing_the_examples_of_a_batch_are_found(kind, found):
    assert analyze_graph(_dual_encoder(kind)).batch_mixing == found


@pytest.mark.parametrize("model", ["bncnn_momentum", "lmmask_momentum", "lm_adam_clip",
                                   "embsparse_rmsprop_clip_centered"])
def test_batch_norm_masked_means_and_lookups_mix_nothing(model):
    """Batch normalisation's moments are recognised (and made exact by
    Config(batch_norm_group)); a masked mean's count, an LSTM over time and
    embedding lookups keep each example to itself."""
    assert analyze_graph(models.build(model).graph).batch_mixing == []


def test_a_keras_step_with_in_batch_negatives_is_found():
    queries, keys = keras.layers.Dense(4, name="queries"), keras.layers.Dense(4, name="keys")
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = keras.ops.matmul(queries(x), keras.ops.transpose(keys(y)))
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
                tf.range(tf.shape(x)[0]), logits)
        variables = queries.trainable_variables + keys.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss
    spec = tf.TensorSpec([None, F], tf.float32)
    analysis = analyze_graph(lift(step.get_concrete_function(spec, spec)).graph)
    assert len(analysis.batch_mixing) == 1 and "MatMul" in analysis.batch_mixing[0]


def test_the_report_says_each_worker_mixes_its_own_share():
    analysis = analyze_graph(_dual_encoder("in_batch_negatives"))
    text = build_report(analysis, make_plan(analysis, 3)).table()
    assert ("the loss mixes the examples of a batch at 'similarity' (in-batch negatives" in text
            and "each of the 3 workers mixes only the examples of its own share" in text)
    assert "mixes the examples" not in build_report(analysis, make_plan(analysis, 1)).table()
