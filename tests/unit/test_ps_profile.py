"""bench/ps_profile.py's count of the messages between processes in a
traced step, on partition graphs written by hand as TensorFlow writes them."""
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf.config_pb2 import RunMetadata

from bench.ps_profile import count_messages

W0 = "/job:worker/replica:0/task:0/device:CPU:0"
PS0 = "/job:ps/replica:0/task:0/device:CPU:0"
PS1 = "/job:ps/replica:0/task:1/device:CPU:0"


def _node(graph, name, op, device, inputs=(), send=None):
    n = graph.node.add(name=name, op=op, device=device)
    n.input.extend(inputs)
    if send is not None:
        n.attr["send_device"].s = send.encode()
        n.attr["recv_device"].s = device.encode()
    return n


def test_counts_run_graph_calls_and_data_and_control_receives():
    worker, ps0, ps1 = graph_pb2.GraphDef(), graph_pb2.GraphDef(), graph_pb2.GraphDef()
    # the worker: rows from ps0 (data), a control edge from ps1 (Identity used as ^input),
    # and a receive inside its own process (no message)
    _node(worker, "rows", "_Recv", W0, send=PS0)
    _node(worker, "stitch", "DynamicStitch", W0, ["rows", "ids"])
    _node(worker, "ordering", "_Recv", W0, send=PS1)
    _node(worker, "ordering_S1", "Identity", W0, ["ordering"])
    _node(worker, "after", "NoOp", W0, ["^ordering_S1"])
    _node(worker, "local", "_HostRecv", W0, send=W0)
    _node(worker, "use_local", "Neg", W0, ["local"])
    # ps0: the ids for its gather (data); ps1: the pushed values (data), and
    # the chief's "pushed" NoOp as a control input of its take (control)
    _node(ps0, "ids", "_Recv", PS0, send=W0)
    _node(ps0, "gather", "ResourceGather", PS0, ["var", "ids"])
    _node(ps1, "values", "_Recv", PS1, send=W0)
    _node(ps1, "push", "SparseAccumulatorApplyGradient", PS1, ["acc", "step", "idx", "values:0"])
    _node(ps1, "pushed", "_Recv", PS1, send=W0)
    _node(ps1, "take", "SparseAccumulatorTakeGradient", PS1, ["acc", "n", "^pushed"])
    md = RunMetadata(partition_graphs=[worker, ps0, ps1])
    m = count_messages(md.SerializeToString(), 0)
    assert m["run_graph_calls"] == 2                       # ps0 and ps1, not the worker itself
    assert (m["data_receives"], m["control_receives"]) == (3, 2)
    assert m["by_pair"] == {"ps0->worker0": {"data": 1, "control": 0},
                            "ps1->worker0": {"data": 0, "control": 1},
                            "worker0->ps0": {"data": 1, "control": 0},
                            "worker0->ps1": {"data": 1, "control": 1}}
