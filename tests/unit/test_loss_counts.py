"""Which losses divide by a count of the batch's values (transforms.loss_counts)."""
import pytest
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.lift import lift
from tests.programs import keras_step

tf1 = tf.compat.v1


def _graph(make_loss):
    g = tf.Graph()
    with g.as_default():
        ids = tf1.placeholder(tf.int32, [None, 3], name="ids")
        emb = tf1.get_variable("emb", [10, 4], tf.float64)
        w = tf1.get_variable("w", [4, 10], tf.float64)
        logits = tf.einsum("bti,iv->btv", tf.nn.embedding_lookup(emb, ids), w)
        targets = tf.roll(ids, 1, axis=1)
        per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
        mask = tf.cast(tf.not_equal(ids, 0), tf.float64)
        loss = make_loss(per, mask, targets, logits)
        tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
    return g


def test_a_token_mean_divides_by_a_count_of_the_batch():
    analysis = analyze_graph(_graph(lambda per, mask, *_: tf.reduce_sum(per * mask)
                                    / tf.maximum(tf.reduce_sum(mask), 1.0)))
    assert analysis.loss_counts == ["Maximum:0"]
    assert analysis.loss_reduction == "mean"


def test_tf1_losses_with_weights_divide_by_the_kept_count():
    analysis = analyze_graph(_graph(lambda per, mask, targets, logits:
                                    tf1.losses.sparse_softmax_cross_entropy(
                                        targets, logits, weights=mask)))
    assert analysis.loss_counts == ["sparse_softmax_cross_entropy_loss/num_present:0"]


@pytest.mark.parametrize("make_loss", [
    lambda per, mask, *_: tf.reduce_mean(per),                                  # the batch's size
    lambda per, mask, targets, logits: tf1.losses.sparse_softmax_cross_entropy(targets, logits),
    # a mean over each example's kept positions: a count per example
    lambda per, mask, *_: tf.reduce_mean(tf.reduce_sum(per * mask, 1)
                                         / tf.maximum(tf.reduce_sum(mask, 1), 1.0)),
], ids=["reduce_mean", "tf1_losses", "per_example"])
def test_counts_of_shapes_or_of_each_example_are_not_rescaled(make_loss):
    assert analyze_graph(_graph(make_loss)).loss_counts == []


def test_a_keras_loss_over_a_masked_sequence_is_rescaled_through_its_weights():
    """Keras weighs each kept position by size / count (a select on the
    mask): the backward pass reads the weights, not the count, so they are
    what the rewrite builds again from the count summed over workers."""
    with keras_step.keras_settings_kept():
        _, _optimizer, concrete = keras_step.sequence_step(mask_zero=True)
        analysis = analyze_graph(lift(concrete).graph)
    (count,) = analysis.loss_counts
    assert count == "sparse_categorical_crossentropy/Sum:0"
    assert analysis.loss_count_reads == {count: ["sparse_categorical_crossentropy/SelectV2:0"]}
    assert analysis.loss_reduction == "mean"


def _weighted(weight):
    """A mean over every position of each position's loss times
    weight(size, count of kept positions, mask)."""
    def make(per, mask, *_):
        size = tf.cast(tf.size(mask), tf.float64)
        return tf.reduce_mean(per * weight(size, tf.reduce_sum(mask), mask))
    return make


def test_weights_of_the_inverse_count_are_what_the_backward_pass_reads():
    analysis = analyze_graph(_graph(_weighted(lambda size, count, mask: mask * (size / count))))
    (count,) = analysis.loss_counts
    assert count == "Sum:0"
    (read,) = analysis.loss_count_reads[count]
    assert read.startswith("mul") and read != count   # the product, read by its gradient


@pytest.mark.parametrize("weight,op", [
    (lambda size, count, mask: mask * tf.sqrt(size / count), "Sqrt"),
    # count^-2
    (lambda size, count, mask: mask * (size / count) / count, None),
    (lambda size, count, mask: mask * (size / count) + 1.0, "AddV2"),
], ids=["sqrt", "squared", "plus_one"])
def test_a_count_in_weights_that_are_no_inverse_of_it_is_refused_naming_the_op(weight, op):
    with pytest.raises(UnsupportedGraphError, match="a count of the batch's values") as refused:
        analyze_graph(_graph(_weighted(weight)))
    if op:
        assert f"({op}) computes with it otherwise than as a weight of count^-1" in str(refused.value)
