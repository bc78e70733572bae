"""Loops over the batch's examples in a TensorFlow 2 step: tf.map_fn, a
tf.scan whose step reads its carry's shape alone, a tf.while_loop reading
and writing a TensorArray at its counter (transforms/example_maps.py), each
example's row its own, trained by 3 workers in one session with 4/4/3
shares as one device trains the 11 examples; and the loops that are no
such map, refused naming the op."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from autopar.common.errors import UnsupportedGraphError
from tests.programs import keras_step
from tests.unit.test_tf2_programs_people_copy import (_three_workers_and_one_device,
                                                      each_worker_holds)


@pytest.fixture(autouse=True)
def _keras_settings():
    with keras_step.keras_settings_kept():
        yield


def _over_the_batch(h):
    """tf.map_fn over the examples' hidden rows, each row scaled by its own
    sum (a reduction inside one example)."""
    return tf.map_fn(lambda row: tf.sin(row) * tf.reduce_sum(row), h)


def _pairs_of_the_batch(h, y):
    """tf.map_fn over two tensors of the batch, one float per example."""
    return tf.map_fn(lambda pair: tf.reduce_sum(pair[0]) * pair[1][0], (h, y),
                     fn_output_signature=tf.float64)[:, None]


def _scan_of_the_shape(h):
    """A tf.scan whose step reads its carry's shape alone (keras-io's CTC
    label densification builds its mask so): a map."""
    return tf.scan(lambda carry, row: row * tf.cast(tf.shape(carry)[0], tf.float64), h,
                   initializer=tf.zeros([3], tf.float64))


def _array_loop(h, item=lambda row, i: tf.tanh(row), bound=lambda n: n, read=0):
    """A hand-written tf.while_loop over a TensorArray of the examples."""
    n = tf.shape(h)[0]
    source = tf.TensorArray(tf.float64, size=n + read).unstack(
        tf.concat([h, h[:read]], 0) if read else h)
    out = tf.TensorArray(tf.float64, size=n)

    def body(i, out):
        return i + 1, out.write(i, item(source.read(i + read) if read else source.read(i), i))
    _, out = tf.while_loop(lambda i, out: i < bound(n), body, (0, out))
    return out.stack()


def _carried_scale(h, bound_too=False):
    """A loop carrying a scale doubled every iteration: the item written
    at i is scaled by 2**i, the example's place again (and a condition
    bounding the scale too, which could end the loop early)."""
    n = tf.shape(h)[0]
    source = tf.TensorArray(tf.float64, size=n).unstack(h)
    out = tf.TensorArray(tf.float64, size=n)

    def body(i, scale, out):
        return i + 1, scale * 2.0, out.write(i, source.read(i) * (1.0 if bound_too else scale))
    _, _, out = tf.while_loop(
        (lambda i, scale, out: tf.logical_and(i < n, scale < 64.0)) if bound_too
        else (lambda i, scale, out: i < n), body, (0, tf.constant(1.0, tf.float64), out))
    return out.stack()


def _vectorized(h):
    """tf.vectorized_map of the same function: vectorised by pfor, each
    example gathered by its place (keras.ops.vectorized_map is it too)."""
    return tf.vectorized_map(lambda row: tf.sin(row) * tf.reduce_sum(row), h)


def _vectorized_with_a_draw(h):
    """A draw inside the mapped function: pfor draws one row per example."""
    return tf.vectorized_map(lambda row: row * tf.random.uniform([3], dtype=tf.float64), h)


def _vectorized_with_the_batchs_mean(h):
    """The mapped function reads a mean over the whole batch."""
    return tf.vectorized_map(lambda row: row * tf.reduce_mean(h), h)


def _running_sum(h):
    return tf.scan(lambda total, row: total + row, h)


def _step(loop, with_labels=False):
    """A Keras Dense, the loop over its output rows, a Dense after it,
    Adam; the concrete function of the step."""
    first, last = layers.Dense(3, activation="tanh", dtype="float64"), \
        layers.Dense(1, dtype="float64")
    first.build((None, 3))
    last.build((None, 1 if with_labels else 3))
    optimizer = keras.optimizers.Adam(0.05)
    loss_fn = keras.losses.MeanSquaredError(dtype="float64")
    weights = first.trainable_weights + last.trainable_weights

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            h = first(x)
            loss = loss_fn(y, last(loop(h, y) if with_labels else loop(h)))
        optimizer.apply(tape.gradient(loss, weights), weights)
        return loss
    cf = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float64),
                                    tf.TensorSpec([None, 1], tf.float64))
    return cf, (first, last, optimizer, step)


@pytest.mark.slow
@pytest.mark.parametrize("loop", ["map_fn", "map_fn_of_pairs", "scan_of_the_shape", "array_loop",
                                  "vectorized_map", "vectorized_map_with_a_draw"])
def test_a_loop_mapping_each_example_trains_as_one_device(loop):
    """Each example's row of the loop's output is its own (before: refused,
    the loop's output taken for values of no known example; the scan was
    accepted and trained differently with 4/4/3 shares: no loss was found
    behind its backward loop, and a mean was assumed without weighing the
    shares). tf.vectorized_map: its count, reduce_max([tf.shape(x)[0]]), is
    the batch's size, its gather of each example by its place the rows
    themselves (before: refused, taken for picks by place); a draw inside
    it, drawn by pfor for every example, is one device's (the function's
    own draw, which pfor leaves beside and no step runs, is not rewritten:
    before, taken for a draw of 3 examples, it made the step's B 9)."""
    keras.utils.set_random_seed(0)
    function, with_labels = {"map_fn": (_over_the_batch, False),
                             "map_fn_of_pairs": (_pairs_of_the_batch, True),
                             "scan_of_the_shape": (_scan_of_the_shape, False),
                             "array_loop": (_array_loop, False),
                             "vectorized_map": (_vectorized, False),
                             "vectorized_map_with_a_draw": (_vectorized_with_a_draw, False)}[loop]
    cf, _kept = _step(function, with_labels)
    rng = np.random.default_rng(2)
    batches = [(rng.normal(size=(11, 3)), rng.normal(size=(11, 1))) for _ in range(3)]
    got, expected = _three_workers_and_one_device(cf, batches, "allreduce")
    assert any("velocity" in v for v in expected)
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize("loop,op", [
    # a carry adding the examples up: each worker would sum its share's
    (_running_sum, "TensorListGetItem"),
    # an item computed from the counter: the example's place in the share
    (lambda h: _array_loop(h, item=lambda row, i: row * tf.cast(i, tf.float64)),
     "TensorListGetItem"),
    # the next example's row read beside each example's
    (lambda h: _array_loop(h, read=1), "strided_slice"),
    # a loop over half of the examples: one device's first half is not a worker's
    (lambda h: _array_loop(h, bound=lambda n: n // 2)[:1], "TensorListGetItem"),
    (_carried_scale, "TensorListGetItem"),
    (lambda h: _carried_scale(h, bound_too=True), "TensorListGetItem"),
    (_vectorized_with_the_batchs_mean, "Mean"),
])
def test_a_loop_over_the_examples_that_is_no_map_is_refused(loop, op):
    """A loop over the examples' rows whose iteration reads more than its
    own example, or writes what its place in the worker's share decides,
    is refused naming the op where the examples meet."""
    from autopar.transforms.compile import compile_for_config
    from autopar.transforms.lift import lift
    import autopar
    keras.utils.set_random_seed(0)
    cf, _kept = _step(loop)
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(lift(cf).graph, 3, autopar.Config())
    assert str(refused.value).startswith("the loss mixes the examples of a batch at '")
    assert op in str(refused.value).split(" (")[0], str(refused.value)[:300]


def test_a_gradient_of_no_loss_the_analysis_finds_is_refused():
    """tape.gradient(outputs, variables, output_gradients=w): no scalar the
    tape differentiates, so neither how the loss reduces over the batch nor
    whether it keeps each example to itself can be read (before: a mean
    was assumed and nothing checked); one worker is one device."""
    from autopar.transforms.compile import compile_for_config
    from autopar.transforms.lift import lift
    import autopar
    dense = layers.Dense(1, dtype="float64")
    dense.build((None, 3))
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            out = dense(x)
        grads = tape.gradient(out, dense.trainable_weights, output_gradients=out - y)
        optimizer.apply(grads, dense.trainable_weights)
    cf = step.get_concrete_function(tf.TensorSpec([None, 3], tf.float64),
                                    tf.TensorSpec([None, 1], tf.float64))
    graph = lift(cf).graph
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 3, autopar.Config())
    message = str(refused.value)
    assert message.startswith("found no loss the gradients are taken of")
    assert "tf.reduce_sum(target * tf.stop_gradient(w))" in message
    compile_for_config(graph, 1, autopar.Config())
