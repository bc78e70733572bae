"""TF1 programs' recurrent layers (tf.compat.v1.nn.dynamic_rnn and its
cells), traced in TensorFlow 2's control flow: the loop reads the batch's
size from its time-major input (tf.shape(x)[1]) and makes the cell's zero
state from it. Read as the examples' count, the state's rows are each
example's and the loop's step is per example; before, that size was taken
for a per-worker length, the state for no example's rows, and every such
program was refused as mixing the batch at the cell's concat."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.ops import rnn_cell_impl   # the zero state TensorFlow's cells make

import autopar
from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.compile import compile_for_config
from autopar.transforms.example_rows import ExampleRows
from autopar.transforms.rewrite import rewrite_for_worker
from tests.unit.local_run import run_locally, run_workers_together

tf1 = tf.compat.v1


class _ElmanCell:
    """tf.compat.v1.nn.rnn_cell.BasicRNNCell's step, tanh([x, h] W + b),
    and its zero state as TensorFlow's cells make it (those cells come
    from legacy Keras, which this process does not load)."""

    def __init__(self, units):
        self.units = units

    @property
    def state_size(self):
        return self.units

    @property
    def output_size(self):
        return self.units

    def zero_state(self, batch_size, dtype):
        return rnn_cell_impl._zero_state_tensors(self.units, batch_size, dtype)

    def __call__(self, x, h, scope=None):
        with tf1.variable_scope("elman_cell", reuse=tf1.AUTO_REUSE):
            w = tf1.get_variable("kernel", [int(x.shape[1]) + self.units, self.units],
                                 tf.float64, tf1.glorot_uniform_initializer(seed=1))
            b = tf1.get_variable("bias", [self.units], tf.float64, tf1.zeros_initializer())
        out = tf.tanh(tf.matmul(tf.concat([x, h], 1), w) + b)
        return out, out


def _rnn_classifier(time_major, lengths=False):
    """x [b, 6] read as 3 steps of 2 features, the last output classified;
    `lengths`: each example's sequence 1-3 steps long, computed from x."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, 6], name="x")
        y = tf1.placeholder(tf.int64, [None], name="y")
        steps = tf.reshape(x, [-1, 3, 2])
        if time_major:
            steps = tf.transpose(steps, [1, 0, 2])
        length = tf.cast(tf.abs(x[:, 0]) * 2, tf.int32) % 3 + 1 if lengths else None
        outputs, _ = tf1.nn.dynamic_rnn(_ElmanCell(5), steps, dtype=tf.float64,
                                        time_major=time_major, sequence_length=length)
        last = outputs[-1] if time_major else outputs[:, -1]
        w = tf1.get_variable("head", [5, 4], tf.float64, tf1.glorot_uniform_initializer(seed=2))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=y, logits=tf.matmul(last, w)))
        train = tf1.train.AdamOptimizer(0.01).minimize(loss)
    return graph, train


def test_the_batch_size_read_from_a_time_major_shape_counts_the_examples():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, 3, 2], name="x")
        time_major = tf.transpose(x, [1, 0, 2])
        batch = tf.shape(time_major)[1]
        steps = tf.shape(time_major)[0]
        state = tf.zeros(tf.concat([tf.expand_dims(batch, 0), [5]], 0), tf.float64)
    rows = ExampleRows(graph)
    assert rows.form(batch) == ("size", 1, 1)
    assert rows.form(steps) == ("shared",)
    assert rows.form(state) == ("rows", 0, "batch", 1, 1)


@pytest.mark.slow
@pytest.mark.parametrize("time_major", [False, True], ids=["batch-major", "time-major"])
def test_dynamic_rnn_trains_as_one_device(time_major):
    """3 workers in one session, 4 steps of an 11-example global batch
    (4/4/3), every variable and slot equal to one device's (the LSTM, GRU
    and stacked cells of legacy Keras, probed the same way, too)."""
    graph, train = _rnn_classifier(time_major)
    n, rng = 3, np.random.default_rng(0)
    batches = [(rng.normal(size=(11, 6)), rng.integers(0, 4, size=11)) for _ in range(4)]
    # (the refusals of a job: the batch's mixing among them)
    compiled = compile_for_config(graph, n, autopar.Config(run_option="allreduce"))
    rewritten = [rewrite_for_worker(graph, compiled.analysis, compiled.plan, w)
                 for w in range(n)]
    with graph.as_default():
        names = [v.op.name for v in tf1.global_variables()]
    assert any("Adam" in name for name in names)

    def train_together(session):
        for x, y in batches:
            session.run([f"w{w}/{train.name}" for w in range(n)],
                        {**{f"w{w}/x:0": x[w::n] for w in range(n)},
                         **{f"w{w}/y:0": y[w::n] for w in range(n)}})
        return [session.run({v: f"w{w}/{v}/Read/ReadVariableOp:0" for v in names})
                for w in range(n)]

    def train_alone(session):
        for x, y in batches:
            session.run(train.name, {"x:0": x, "y:0": y})
        return session.run({v: f"{v}/Read/ReadVariableOp:0" for v in names})
    expected = run_locally(graph.as_graph_def(), train_alone)
    for w, values in enumerate(run_workers_together(rewritten, train_together)):
        for v in names:
            # (Adam's m / sqrt(v) turns the last bits of gradients added in
            # another order into differences far below its lr 0.01)
            np.testing.assert_allclose(values[v], expected[v], rtol=1e-7, atol=1e-9,
                                       err_msg=f"worker {w} {v}")


def test_a_sequence_length_loops_to_each_workers_longest_and_is_refused():
    """With sequence_length, dynamic_rnn runs its loop to the batch's longest
    sequence, a statistic of the batch's values: each worker would run to
    its share's. The loop is named (before: refused as the cell's MatMul
    mixing the batch)."""
    graph, _ = _rnn_classifier(False, lengths=True)
    with pytest.raises(UnsupportedGraphError,
                       match="at 'rnn/while' \\(a StatelessWhile running as many times as "
                             "'rnn/Minimum', a statistic of the worker's batch's values"):
        compile_for_config(graph, 3, autopar.Config(run_option="allreduce"))
