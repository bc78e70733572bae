"""Which compiled metrics autopar.fit updates on whole batches
(runtime/whole_batch_metrics.py): those whose state is no sum of what each
example adds, told from the data flow of their functions."""
import numpy as np
import tensorflow as tf

from autopar.runtime.whole_batch_metrics import find_whole_batch_metrics


def masked_accuracy(label, pred):
    """TensorFlow's Transformer tutorial's: one ratio per batch."""
    pred = tf.argmax(pred, axis=2)
    label = tf.cast(label, pred.dtype)
    mask = label != 0
    match = tf.cast((label == pred) & mask, tf.float32)
    return tf.reduce_sum(match) / tf.reduce_sum(tf.cast(mask, tf.float32))


def per_position_accuracy(label, pred):
    """One value per example: a mean over its own positions."""
    return tf.reduce_mean(tf.cast(tf.cast(label, tf.int64) == tf.argmax(pred, axis=2),
                                  tf.float32), axis=1)


def centred(label, pred):
    """One value per example, each minus the batch's mean: mixes them."""
    first = pred[:, 0, 0]
    return first - tf.reduce_mean(first)


def _whole(metrics):
    import keras

    class Maximum(keras.metrics.Metric):
        """A metric of the program's own: nothing is known of its update."""

        def __init__(self):
            super().__init__(name="maximum")
            self.top = self.add_variable((), initializer="zeros", name="top")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.top.assign(tf.maximum(self.top, tf.reduce_max(y_pred)))

        def result(self):
            return self.top
    model = keras.Sequential([keras.Input((None,), dtype="int32"),
                              keras.layers.Embedding(20, 4), keras.layers.Dense(5)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy",
                  metrics=[Maximum() if m == "maximum" else m for m in metrics])
    y = np.ones((3, 6), np.int32)
    return find_whole_batch_metrics(model, y, np.zeros((3, 6, 5), np.float32)).names()


def test_a_metric_reducing_the_batch_to_one_value_is_a_whole_batch_metric():
    assert _whole([masked_accuracy, "accuracy", per_position_accuracy]) == ["masked_accuracy"]


def test_a_metric_mixing_the_examples_or_of_the_programs_own_is_a_whole_batch_metric():
    assert _whole([centred, "maximum", "sparse_categorical_accuracy"]) == ["centred", "maximum"]


def test_keras_metrics_that_add_up_are_summed_over_workers():
    assert _whole(["accuracy", "sparse_top_k_categorical_accuracy", per_position_accuracy]) == []
