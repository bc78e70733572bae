"""Which inputs a training step checks for padding alike on every worker
(transforms.padded_lengths), and that the check runs in training steps
alone."""
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import make_plan
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker

tf1 = tf.compat.v1


def _graph():
    """ids [None, None] and a fixed-width feature [None, 3] trained on; an
    evaluation-only input [None, None] no loss reads."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [None, None], name="ids")
        dense = tf1.placeholder(tf.float32, [None, 3], name="dense")
        tf1.placeholder(tf.float32, [None, None], name="eval_only")
        table = tf1.get_variable("table", [10, 3])
        h = tf.reduce_mean(tf.nn.embedding_lookup(table, ids), axis=1) + dense
        w = tf1.get_variable("w", [3, 1])
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(h, w) ** 2))
    return graph


def test_only_inputs_a_loss_reads_with_unknown_lengths_are_checked():
    analysis = analyze_graph(_graph())
    assert analysis.padded_inputs == {"ids:0": [1]}
    assert ("inputs of unknown lengths ('ids:0'): each training step checks that every worker "
            "padded its batch to the same length" in build_report(analysis,
                                                                  make_plan(analysis, 2)).table())
    assert "inputs of unknown lengths" not in build_report(analysis, make_plan(analysis, 1)).table()


def test_the_check_runs_under_the_in_step_flag_on_several_workers_only():
    graph = _graph()
    analysis = analyze_graph(graph)
    rewritten = rewrite_for_worker(graph, analysis, make_plan(analysis, 2), 0)
    assert rewritten.in_step == "autopar/in_step:0"
    nodes = {n.name: n for n in rewritten.meta_graph.graph_def.node}
    checked = [n for n in nodes if n.startswith("autopar/padded_lengths/")]
    assert checked and any(nodes[n].op in ("If", "StatelessIf", "Switch", "Merge")
                           for n in checked)
    # every reader of the ids but the check's reads the checked ids
    readers = [n for n in nodes.values() if "ids" in n.input and not
               n.name.startswith("autopar/padded_lengths/")]
    assert not readers, [n.name for n in readers]
    single = rewrite_for_worker(graph, analysis, make_plan(analysis, 1), 0)
    assert not any(n.name.startswith("autopar/padded_lengths/")
                   for n in single.meta_graph.graph_def.node)


def test_a_cond_on_whether_every_label_passes_is_checked_alike():
    """Keras's Hinge loss converts labels of 0 and 1 to -1 and 1 where all of
    the batch's are: the cond's boolean is read through the check on
    several workers, which names the cond."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        binary = tf.reduce_all(tf.logical_or(tf.equal(y, 0.0), tf.equal(y, 1.0)), name="binary")
        labels = tf.cond(binary, lambda: 2.0 * y - 1.0, lambda: y, name="converted")
        out = tf.matmul(x, tf1.get_variable("w", [3, 1]))
        tf1.train.GradientDescentOptimizer(0.1).minimize(
            tf.reduce_mean(tf.nn.relu(1.0 - labels * out)))
    analysis = analyze_graph(graph)
    assert analysis.checked_predicates == {"binary:0": "converted"}
    assert analysis.batch_mixing == {}
    assert ("conds deciding by whether every example, or any, of the batch passes a test "
            "('converted')" in build_report(analysis, make_plan(analysis, 2)).table())
    rewritten = rewrite_for_worker(graph, analysis, make_plan(analysis, 2), 0)
    nodes = rewritten.meta_graph.graph_def.node
    assert not [n.name for n in nodes if "binary" in n.input
                and not n.name.startswith("autopar/padded_lengths/")]
    graph_def = rewritten.meta_graph.graph_def
    consts = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    messages = [text.decode() for n in consts if n.op == "Const"
                for text in n.attr["value"].tensor.string_val]
    assert any("decide 'converted' apart ('binary:0' holds on some workers" in m
               for m in messages), messages
