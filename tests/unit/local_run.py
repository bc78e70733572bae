"""A worker's rewritten graph run in a session of the test's own process."""
import tensorflow as tf

tf1 = tf.compat.v1


def run_locally(graph_def, runs):
    """runs(session) on `graph_def` imported into a session of this process
    alone (its devices cleared), its variables initialised."""
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    for node in graph_def.node:
        node.device = ""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=graph) as session:
            session.run([op for op in graph.get_operations() if op.name.endswith("/Assign")])
            return runs(session)
