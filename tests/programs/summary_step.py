"""A Keras model trained by a tf.function step that writes tf.summary
records inside it (as TensorFlow's pix2pix tutorial writes its losses): a
scalar of the loss at the optimizer's step and a histogram of a kernel at a
step given as input, inside the writer's scope (which flushes)."""
import glob

import numpy as np


def build(logdir, record_if=None):
    """(step, its ConcreteFunction); with `record_if(k)` the scalar is
    written under tf.summary.record_if of it, and no histogram."""
    import keras
    import tensorflow as tf
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                              keras.layers.Dense(1)])
    opt = keras.optimizers.Adam(0.01)
    writer = tf.summary.create_file_writer(str(logdir))

    @tf.function
    def step(x, y, k):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                model.trainable_variables))
        with writer.as_default():
            if record_if is None:
                tf.summary.scalar("loss", loss, step=opt.iterations)
                tf.summary.histogram("kernel", model.trainable_variables[0], step=k)
            else:
                with tf.summary.record_if(record_if(k)):
                    tf.summary.scalar("loss", loss, step=opt.iterations)
        return loss
    step.writer = writer
    return step, step.get_concrete_function(tf.TensorSpec([None, 4]), tf.TensorSpec([None, 1]),
                                            tf.TensorSpec([], tf.int64))


def events(logdir) -> list[tuple[int, str, np.ndarray]]:
    """(step, tag, value) of every summary written under `logdir`."""
    import tensorflow as tf
    out = []
    for path in sorted(glob.glob(f"{logdir}/events.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            out += [(event.step, v.tag, tf.make_ndarray(v.tensor)) for v in event.summary.value]
    return out


def batches():
    """Three batches (x, y, k) of 8 examples."""
    rng = np.random.default_rng(3)
    return [(rng.normal(size=(8, 4)).astype("f4"), rng.normal(size=(8, 1)).astype("f4"),
             np.int64(10 * k)) for k in range(3)]
