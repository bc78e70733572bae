"""runtime/timeline.py without a job: what phase an op of a traced step is
in, and how the launcher merges the workers' parts (clock offsets applied,
lanes named, oldest steps dropped to stay under the byte cap)."""
import json

import pytest

from autopar.runtime import timeline


@pytest.mark.parametrize("node, op_type, on_server, phase", [
    ("RecvTensor", "", True, "push"),
    ("RecvTensor", "", False, "pull"),
    ("RecvBuf", "", False, "collective transfer"),
    ("autopar/average/CollectiveReduceV2_1", "CollectiveReduceV2", False, "all-reduce"),
    ("autopar/ps/CollectiveGatherV2", "CollectiveGatherV2", False, "all-gather"),
    ("autopar/ps/QueueEnqueueV2", "QueueEnqueueV2", True, "barrier"),
    ("autopar/ps/SparseAccumulatorApplyGradient", "SparseAccumulatorApplyGradient", True,
     "server update"),
    ("gradients/MatMul_grad/MatMul", "MatMul", False, "backward"),
    ("Adam/update_lstm/ResourceApplyAdam", "ResourceApplyAdam", False, "update"),
    ("lstm/MatMul", "MatMul", False, "forward"),
])
def test_an_op_is_in_the_phase_of_what_it_is(node, op_type, on_server, phase):
    assert timeline.phase_of(node, op_type, on_server) == phase


def _part(lane, offset_s, steps):
    return json.dumps({"lane": lane, "clock_offset_s": offset_s, "clock_rtt_s": 0.001,
                       "steps": [{"name": "step", "ph": "X", "ts": 1000.0 * s, "dur": 10.0,
                                  "pid": lane, "tid": "step", "args": {"step": s, "by": lane}}
                                 for s in steps]}).encode()


def test_parts_merge_onto_one_clock_and_the_oldest_steps_go_first():
    cluster = {"worker": ["a:1", "a:2"], "ps": ["a:3"]}
    parts = {"w0": _part("worker 0", 0.5, [2, 4, 6]), "w1": _part("worker 1", -0.25, [2, 4, 6])}
    trace = timeline.merge(parts, cluster, helpers={"sumserver": 1}, job="abc")
    lanes = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    assert list(lanes) == ["worker 0", "worker 1", "server 0", "sumserver 0"]
    w0 = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == lanes["worker 0"]]
    assert [e["ts"] for e in w0] == [2000 + 5e5, 4000 + 5e5, 6000 + 5e5]
    assert trace["otherData"]["clock_offsets_s"] == {"worker 0": 0.5, "worker 1": -0.25}
    full = len(json.dumps(trace))
    cut = timeline.merge(parts, cluster, helpers={"sumserver": 1}, job="abc", max_bytes=full - 1)
    assert cut["otherData"]["steps"] == [4, 6]
    assert len(json.dumps(cut)) <= full - 1


def test_a_servers_events_in_a_workers_trace_move_by_the_servers_offset():
    cluster = {"worker": ["a:1"], "ps": ["b:1"]}
    worker = json.loads(_part("worker 0", 0.5, [2]))
    worker["steps"].append({"name": "server update", "ph": "X", "ts": 3000.0, "dur": 5.0,
                            "pid": "server 0", "tid": "ops", "args": {"step": 2, "by": "worker 0"}})
    parts = {"w0": json.dumps(worker).encode(), "s0": timeline.clock_part("server 0", -2.0, 0.002)}
    trace = timeline.merge(parts, cluster, helpers={}, job="abc")
    lanes = {e["args"]["name"]: e["pid"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    moved = {e["pid"]: e["ts"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert moved == {lanes["worker 0"]: 2000 + 5e5, lanes["server 0"]: 3000 - 2e6}
    assert trace["otherData"]["clock_offsets_s"] == {"worker 0": 0.5, "server 0": -2.0}
    # Without a part of its own, a server's events move with the worker's.
    alone = timeline.merge({"w0": parts["w0"]}, cluster, helpers={}, job="abc")
    assert sorted(e["ts"] for e in alone["traceEvents"] if e["ph"] == "X") == [2000 + 5e5,
                                                                             3000 + 5e5]
