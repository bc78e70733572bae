"""A later job of a script (its processes' second autopar.fit or
get_runner) runs on the processes its first job started, whose TensorFlow
servers keep the first job's resources and collective groups: its graph's
resources go into a container of their own and its collectives into groups
of their own (runtime/worker.py; the jobs themselves:
tests/integration/test_script_shapes.py)."""
import tensorflow as tf

from autopar.runtime.worker import in_container, in_groups_above
from autopar.transforms.comm import CollectiveOpsBackend
from autopar.transforms.features.base import in_step_cond, in_step_flag

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


def test_a_later_jobs_collectives_in_functions_are_in_groups_of_their_own():
    """A collective run in training steps alone (the call of a cond's branch,
    transforms.features.base.in_step_cond) moves too, inside its function,
    which takes a name of its own (before: it kept the first job's group,
    whose instance of another shape the second job's met)."""
    graph = tf.Graph()
    with graph.as_default():
        flag = in_step_flag(graph)
        x = tf.constant([1.0, 2.0])
        out = in_step_cond(flag, lambda: CollectiveOpsBackend(1, 7).allreduce_sum(x, 3),
                           lambda: tf.identity(x))
    graph_def = graph.as_graph_def()
    branches = {f.signature.name for f in graph_def.library.function}
    in_groups_above(graph_def, 100_000)

    def group_keys(f):
        consts = {n.name: int(tf.make_ndarray(n.attr["value"].tensor)) for n in f.node_def
                  if n.op == "Const"}
        return [consts[n.input[2].split(":")[0]] for n in f.node_def
                if n.op == "CollectiveReduceV2"]
    functions = {f.signature.name: f for f in graph_def.library.function}
    moved = [name for name, f in functions.items() if group_keys(f)]
    assert len(moved) == 1 and group_keys(functions[moved[0]]) == [100_007]
    assert moved[0] not in branches
    (cond,) = [n for n in graph_def.node if n.op in ("If", "StatelessIf")]
    assert cond.attr["then_branch"].func.name == moved[0]
    assert cond.attr["else_branch"].func.name in branches   # no collective: kept
    with tf.Graph().as_default() as imported:   # a graph TensorFlow takes
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf1.Session(graph=imported) as session:
            assert list(session.run(out.name)) == [1.0, 2.0]   # (not in a step)
