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

import autopar
from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.compile import compile_for_config
from autopar.transforms.example_rows import ExampleRows
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from tests.programs.rnn_lengths import ElmanCell   # BasicRNNCell's step, no legacy Keras
from tests.unit.local_run import (each_worker_holds, trained_alone_and_together,
                                  variable_reads)

tf1 = tf.compat.v1


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
        outputs, _ = tf1.nn.dynamic_rnn(ElmanCell(5, tf.float64), steps, dtype=tf.float64,
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
@pytest.mark.parametrize("time_major,lengths", [(False, False), (True, False), (False, True)],
                         ids=["batch-major", "time-major", "sequence lengths"])
def test_dynamic_rnn_trains_as_one_device(time_major, lengths):
    """3 workers in one session, 4 steps of an 11-example global batch
    (4/4/3), every variable and slot equal to one device's (the LSTM, GRU
    and stacked cells of legacy Keras, probed the same way, too). With
    sequence lengths, the loop runs to the batch's longest, which each
    training step takes of the global batch (before: each worker's own;
    the program was refused)."""
    graph, train = _rnn_classifier(time_major, lengths)
    n, rng = 3, np.random.default_rng(0)
    batches = [(rng.normal(size=(11, 6)), rng.integers(0, 4, size=11)) for _ in range(4)]
    # (the refusals of a job: the batch's mixing among them)
    compiled = compile_for_config(graph, n, autopar.Config(run_option="allreduce"))
    # (the loop's bound: min(steps, max(1, the batch's longest)))
    assert list(compiled.analysis.batch_statistics.values()) == (["Max"] if lengths else [])
    rewritten = [rewrite_for_worker(graph, compiled.analysis, compiled.plan, w)
                 for w in range(n)]
    reads = variable_reads(graph)
    assert any("Adam" in name for name in reads)
    got, expected = trained_alone_and_together(graph, rewritten, train.name, batches,
                                               ("x:0", "y:0"), reads)
    # (Adam's m / sqrt(v) turns the last bits of gradients added in
    # another order into differences far below its lr 0.01)
    each_worker_holds(got, expected, rtol=1e-7, atol=1e-9)


def test_the_batchs_longest_is_reported_and_not_split_in_micro_batches():
    graph, _ = _rnn_classifier(False, lengths=True)
    compiled = compile_for_config(graph, 3, autopar.Config(run_option="allreduce"))
    report = build_report(compiled.analysis, compiled.plan).table()
    assert "statistics of the batch's values ('rnn/Max:0'" in report, report
    with pytest.raises(UnsupportedGraphError, match="micro_batches=2.*'rnn/Max:0'"):
        compile_for_config(graph, 3, autopar.Config(run_option="allreduce", micro_batches=2))


# The same programs in a TF1-era script that calls disable_v2_behavior()
# first: dynamic_rnn's loop is a V1 while loop (Enter, Merge, Switch,
# LoopCond) keeping its steps in TensorArrayV3s, its variables reference
# variables.
_V1_RNN = r"""
import json, sys
import numpy as np
import tensorflow as tf
tf1 = tf.compat.v1
tf1.disable_v2_behavior()
import autopar
from autopar.transforms.compile import compile_for_config
from autopar.transforms.rewrite import rewrite_for_worker
from tests.unit.local_run import trained_alone_and_together, variable_reads
from tests.unit.test_tf1_rnns import _rnn_classifier
time_major, lengths = sys.argv[1] == "time-major", sys.argv[2] == "lengths"
graph, train = _rnn_classifier(time_major, lengths)
n, rng = 3, np.random.default_rng(0)
batches = [(rng.normal(size=(11, 6)), rng.integers(0, 4, size=11)) for _ in range(4)]
compiled = compile_for_config(graph, n, autopar.Config(run_option="allreduce"))
rewritten = [rewrite_for_worker(graph, compiled.analysis, compiled.plan, w) for w in range(n)]
reads = variable_reads(graph)
names = sorted(reads)
got, expected = trained_alone_and_together(graph, rewritten, train.name, batches, ("x:0", "y:0"),
                                           reads)
print(json.dumps({"variables": names, "refs": [graph.get_operation_by_name(v).type for v in names],
                  "statistics": list(compiled.analysis.batch_statistics.values()),
                  "worst": max(float(np.max(np.abs(values[v] - expected[v]) /
                                             (np.abs(expected[v]) + 1e-3)))
                               for values in got for v in names)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("time_major,lengths", [("time-major", "-"), ("batch-major", "lengths")])
def test_dynamic_rnn_under_v1_behaviour_trains_as_one_device(time_major, lengths):
    """Under disable_v2_behavior(), a TensorArray's ops are read as the
    TensorList ops each acts as (its flow tensor carrying the list), and a
    V1 loop bounded by the batch's longest sequence takes the global
    batch's (before: refused, naming TensorArrayScatterV3, and with lengths
    the loop's Switch). 3 workers with 4/4/3 shares, every variable and
    slot (reference variables) equal to one device's after 4 steps."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _V1_RNN, time_major, lengths], cwd=root,
                          capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "VariableV2" in result["refs"] and any("Adam" in v for v in result["variables"])
    assert result["statistics"] == (["Max"] if lengths == "lengths" else [])
    # (Adam's m / sqrt(v) of gradients added in another order, float64)
    assert result["worst"] < 1e-7, result
