"""TensorFlow's quickstart training step, Keras 3: the step hands its loss
and predictions to Keras metrics and returns nothing; the loop reads the
metrics' results from Python. Metrics: a Mean of the loss (scalars), an
accuracy, and an AUC of the arg-max class (its state is arrays).
`dtype`: Keras's floatx (float64 where Adam divides by sqrt(v))."""
from __future__ import annotations

import numpy as np

FEATURES, CLASSES = 6, 3


def build(dtype: str = "float32"):
    """(the tf.function step, its metrics, its optimizer)."""
    import keras
    import tensorflow as tf
    keras.config.set_floatx(dtype)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(CLASSES)])
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam()
    metrics = [keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy(),
               keras.metrics.AUC(num_thresholds=5)]

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            loss = loss_object(y, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        metrics[0](loss)
        metrics[1](y, predictions)
        metrics[2](tf.one_hot(y, CLASSES), tf.nn.softmax(predictions))
    return train_step, metrics, optimizer


def batches(count: int, size: int, dtype: str = "float32"):
    """`count` global batches (x, y) of `size` examples."""
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(size, FEATURES)).astype(dtype), rng.integers(0, CLASSES, size=size))
            for _ in range(count)]
