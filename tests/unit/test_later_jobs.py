"""A later job of a script (its processes' second autopar.fit or
get_runner) runs on the processes its first job started, whose TensorFlow
servers keep the first job's resources and collective groups: its graph's
resources go into a container of their own and its collectives into groups
of their own (runtime/worker.py; the jobs themselves:
tests/integration/test_script_shapes.py)."""
import tensorflow as tf

from autopar.runtime.worker import in_container, in_groups_above
from autopar.transforms.comm import CollectiveOpsBackend

tf1 = tf.compat.v1


def _graph_def():
    """An all-reduce in a group of 1 with key 1 (one constant for both) and
    instance key 1, and a variable and a queue."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.get_variable("w", [2], use_resource=True)
        tf1.FIFOQueue(2, [tf.float32], shared_name="q")
        CollectiveOpsBackend(1, 1).allreduce_sum(tf.constant([1.0]), 1)
    return graph.as_graph_def()


def test_a_later_jobs_collectives_are_in_groups_of_their_own():
    graph_def = _graph_def()
    in_groups_above(graph_def, 100_000)
    nodes = {n.name: n for n in graph_def.node}
    (reduce,) = [n for n in graph_def.node if n.op == "CollectiveReduceV2"]
    size, key, instance = (int(tf.make_ndarray(nodes[name].attr["value"].tensor))
                           for name in reduce.input[1:4])
    # only the group key moved: its size and instance key share its constant
    assert (size, key, instance) == (1, 100_001, 1)


def test_a_later_jobs_resources_are_in_a_container_of_their_own():
    graph_def = _graph_def()
    in_container(graph_def, "autopar-job2")
    containers = {n.op: n.attr["container"].s for n in graph_def.node
                  if n.op in ("VarHandleOp", "FIFOQueueV2")}
    assert containers == {"VarHandleOp": b"autopar-job2", "FIFOQueueV2": b"autopar-job2"}
    # which TensorFlow takes (a container name has no underscore)
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf1.Session(graph=graph) as session:
            session.run(graph.get_operation_by_name("w/Initializer/random_uniform").outputs[0])
            session.run("w/Assign")
