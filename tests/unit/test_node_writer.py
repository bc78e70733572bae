"""ops.NodeWriter: NodeDefs written next to a graph built through the
API must import as the ops TensorFlow would build (the rewrite's meaning is
checked against the API-built graphs by bench/rewrite_snapshot.py; this
checks the writer's own pieces on small graphs)."""
import tensorflow as tf

from autopar.transforms.ops import NodeWriter

tf1 = tf.compat.v1

DEVICES = ("/job:ps/task:0/device:CPU:0", "/job:ps/task:1/device:CPU:0")


def _group_structure(graph_def, root: str) -> list:
    """(device, sorted control inputs' structures) of `root`, recursively over NoOps."""
    nodes = {n.name: n for n in graph_def.node}

    def walk(name):
        node = nodes[name]
        if node.op != "NoOp":
            return name
        return (node.device, sorted((walk(i.lstrip("^")) for i in node.input), key=repr))
    return walk(root)


def _ops(graph, devices):
    out = []
    with graph.as_default():
        for k, device in enumerate(devices):
            with tf.device(device):
                out.append(tf.constant(float(k), name=f"c{k}").op)
    return out


def test_group_is_tf_group_on_one_and_on_several_devices():
    for devices in ([DEVICES[0]] * 2, [DEVICES[0], DEVICES[1], DEVICES[0]]):
        reference = tf.Graph()
        ops = _ops(reference, devices)
        with reference.as_default():
            tf.group(*ops, name="joined")
        written = tf.Graph()
        ops = _ops(written, devices)
        nodes = NodeWriter(None, "", "autopar/nodes/", written)
        nodes.group([(op.name, op.device) for op in ops], name="joined")
        graph_def = written.as_graph_def()
        nodes.flush(graph_def)
        assert (_group_structure(graph_def, "joined")
                == _group_structure(reference.as_graph_def(), "joined"))


def test_pending_nodes_import_and_compute_with_the_graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4], name="x")
        done = tf.no_op(name="done")     # patched at the flush
    nodes = NodeWriter(None, "", "autopar/nodes/", graph)
    bounds = [nodes.pooled_const([k], tf.int32) for k in (1, 3, 1)]
    assert nodes.pooled_const([1], tf.int32) == bounds[0]   # shared
    piece = nodes.add("StridedSlice", [x, *bounds], T=tf.float32, Index=tf.int32)
    doubled = nodes.add("Mul", [piece, nodes.add_const(2.0, tf.float32)], T=tf.float32)
    nodes.group([(doubled, "")], into=done.name)
    with graph.as_default():
        # an op built through the API after the writer's: its names stay distinct
        with tf.name_scope("autopar/nodes"):
            later = tf.constant(1.0, name="Mul")
    assert later.op.name not in nodes.by_name
    graph_def = graph.as_graph_def()
    added = nodes.flush(graph_def)
    assert doubled in added and len({n.name for n in graph_def.node}) == len(graph_def.node)
    assert f"^{doubled}" in {n.name: n for n in graph_def.node}["done"].input
    out = tf.Graph()
    with out.as_default():
        tf1.import_graph_def(graph_def, name="")
        with tf1.Session() as sess:
            value = sess.run(out.get_tensor_by_name(doubled + ":0"),
                             {out.get_tensor_by_name("x:0"): [1.0, 2.0, 3.0, 4.0]})
    assert list(value) == [4.0, 6.0]
