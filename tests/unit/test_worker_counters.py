"""The report names the running totals of tf.compat.v1.metrics a training
run adds each worker's own batches to (transforms.worker_counters): read on
a worker they are its share's, which autopar said nowhere before."""
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import make_plan
from autopar.transforms.report import build_report

tf1 = tf.compat.v1


def _graph(metrics: bool):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        y = tf1.placeholder(tf.int64, [None], name="y")
        w = tf1.get_variable("w", [3, 2])
        logits = tf.matmul(x, w)
        loss = tf1.losses.sparse_softmax_cross_entropy(y, logits)
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        # a local variable no batch writes: not a total of the batches
        tf1.get_variable("steps_seen", [], tf.int64, collections=[tf1.GraphKeys.LOCAL_VARIABLES],
                         initializer=tf1.zeros_initializer())
        if metrics:
            tf1.metrics.accuracy(y, tf.argmax(logits, 1))
            tf1.metrics.mean(loss)
    return graph


def test_the_totals_tf1_metrics_add_each_workers_batches_to_are_named_in_the_report():
    analysis = analyze_graph(_graph(metrics=True))
    # mean/count adds 1 per run, alike on every worker: no batch's figure
    assert analysis.worker_counters == ["accuracy/count", "accuracy/total", "mean/total"]
    assert ("running totals in local variables ('accuracy/count', 'accuracy/total', "
            "'mean/total'; tf.compat.v1.metrics' totals): each worker adds its own batches' "
            "figures, so a value read from them is that worker's share's" in
            build_report(analysis, make_plan(analysis, 3)).table())
    # one device's own totals
    assert "running totals" not in build_report(analysis, make_plan(analysis, 1)).table()


def test_a_graph_without_metrics_has_no_totals():
    analysis = analyze_graph(_graph(metrics=False))
    assert analysis.worker_counters == []
    assert "running totals" not in build_report(analysis, make_plan(analysis, 3)).table()
