"""Balanced fusion buffers (transforms.methods.herring.bfb), the herring method's plan, report
and rewrite (transforms.methods.herring.method). Expected layouts are written out by hand
from the rule in transforms/methods/herring/bfb.py's docstring, not computed by it."""
import math

import numpy as np
import pytest
import tensorflow as tf

from autopar.common.errors import AutoparError, SpecError
from autopar.config import Config
from autopar.transforms.methods.herring import bfb
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.methods.herring.bfb import FusionBuffer, FusionLayout, Segment, Shard
from autopar.transforms.compile import CompiledPlan, compile_plan
from autopar.transforms.methods.herring.method import Herring, predicted_faster
from autopar.transforms.plan import Plan, PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.methods.registry import METHODS
from tests.models import build_case

tf1 = tf.compat.v1

TWO_HOSTS = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"), num_servers=2)


# ------------------------------------------------------------ the layout
def test_layout_offsets_segments_and_shards():
    """a(10) b(3) c(7) in that order, buffers of 6 over 2 servers: the stream
    a=[0,10) b=[10,13) c=[13,20) cut at 6, 12, 18."""
    got = bfb.layout([("a", 10), ("b", 3), ("c", 7)], num_servers=2, buffer_size=6)
    two = [Shard(0, 0, 3), Shard(1, 3, 3)]
    assert got.buffers == [
        FusionBuffer(0, 6, [Segment("a", 0, 0, 6)], two),
        FusionBuffer(1, 6, [Segment("a", 6, 0, 4), Segment("b", 0, 4, 2)], two),
        FusionBuffer(2, 6, [Segment("b", 2, 0, 1), Segment("c", 0, 1, 5)], two),
        FusionBuffer(3, 2, [Segment("c", 5, 0, 2)], [Shard(0, 0, 1), Shard(1, 1, 1)]),
    ]
    assert got.order == ["a", "b", "c"] and got.sizes == [10, 3, 7]
    assert got.buffers_of("b") == [1, 2]


def test_last_buffer_shards_differ_by_one_and_empty_ones_are_left_out():
    # 6 + 6 + 2 elements over 3 servers: full buffers split 2/2/2, the last 1/1/-
    got = bfb.layout([("a", 14)], num_servers=3, buffer_size=6)
    assert [b.shards for b in got.buffers] == [
        [Shard(0, 0, 2), Shard(1, 2, 2), Shard(2, 4, 2)]] * 2 + [[Shard(0, 0, 1), Shard(1, 1, 1)]]
    # 5 elements over 2: the first shard is the larger
    assert bfb.shards(5, 2) == [Shard(0, 0, 3), Shard(1, 3, 2)]


def test_a_gradient_spanning_three_buffers():
    got = bfb.layout([("x", 1), ("big", 9), ("y", 2)], num_servers=1, buffer_size=4)
    assert [[(s.variable, s.start, s.offset, s.length) for s in b.segments] for b in got.buffers] == [
        [("x", 0, 0, 1), ("big", 0, 1, 3)], [("big", 3, 0, 4)], [("big", 7, 0, 2), ("y", 0, 2, 2)]]


def test_buffer_size_must_split_evenly():
    with pytest.raises(ValueError, match="multiple of the server count"):
        bfb.layout([("a", 10)], num_servers=4, buffer_size=6)


def test_buffer_size_rule():
    mib = 1 << 20
    # 400 MB model, 2 servers: model/8 = 12.5M elements, inside [2 x 256 KiB, 64 MiB]
    assert bfb.buffer_elements(100_000_000, 2)[0] == 12_500_000
    # 4 GB model: capped at 64 MiB = 16M float32 elements
    assert bfb.buffer_elements(1_000_000_000, 2)[0] == 64 * mib // 4
    # 1 MB model on 4 servers: model/8 = 31250 elements < 4 x 256 KiB = 262144 elements
    assert bfb.buffer_elements(250_000, 4)[0] == 250_000
    # 4 MB model on 4 servers: model/8 = 125000 elements < the floor, 262144
    assert bfb.buffer_elements(1_000_000, 4)[0] == 262_144
    # a model smaller than one buffer: the model, rounded up to a multiple of the servers
    assert bfb.buffer_elements(1001, 2)[0] == 1002
    # 3 servers: model/8 = 13_333_334 rounded up to 13_333_335
    assert bfb.buffer_elements(106_666_668, 3)[0] == 13_333_335
    # override: 100 bytes = 25 elements, rounded up to 27 for 3 servers
    b, why = bfb.buffer_elements(1000, 3, override_bytes=100)
    assert b == 27 and "herring_buffer_bytes=100" in why


# ------------------------------------------------------------ order from the graph
def _chain_graph():
    """Three layers created in the order b, c, a, used as x @ c -> @ b -> @ a:
    backpropagation produces a's gradient first, then b's, then c's."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4, 3], name="x")
        init = tf1.random_uniform_initializer(-1.0, 1.0, seed=3)
        b = tf1.get_variable("b", [5, 2], initializer=init)
        c = tf1.get_variable("c", [3, 5], initializer=init)
        a = tf1.get_variable("a", [2, 4], initializer=init)
        h = tf.tanh(tf.matmul(tf.tanh(tf.matmul(x, c)), b))
        loss = tf.reduce_mean(tf.square(tf.matmul(h, a)), name="loss")
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph, x, train


def test_production_order_read_from_the_graph():
    graph, _, _ = _chain_graph()
    analysis = analyze_graph(graph)
    assert [v.name for v in analysis.variables] == ["b", "c", "a"]   # creation order
    assert [v.name for v in bfb.production_order(analysis.variables)] == ["a", "b", "c"]
    layout = bfb.plan_layout(analysis, {"a", "b", "c"}, num_servers=2, override_bytes=24)
    # a(8) b(10) c(15): buffers of 6 elements
    assert layout.order == ["a", "b", "c"] and layout.sizes == [8, 10, 15]
    assert [b.elements for b in layout.buffers] == [6, 6, 6, 6, 6, 3]


def test_identical_on_every_process():
    """Each process builds the graph and plans it itself: equal plans."""
    options = PlanOptions(run_option="herring", herring_buffer_bytes=64)
    plans = [compile_plan(build_case("mlp", "momentum", clip=True).graph, TWO_HOSTS, options)
             for _ in range(2)]
    assert METHODS["herring"].state(plans[0].plan).layout is not None
    assert plans[0].to_json() == plans[1].to_json()


# ------------------------------------------------------------ the plan
def _plan(topology=TWO_HOSTS, **options):
    case = build_case("mlp", "momentum", clip=True)
    analysis = analyze_graph(case.graph)
    return case, analysis, make_plan(analysis, topology, options=PlanOptions(**options))


def test_herring_plan_covers_every_dense_float32_gradient():
    _, analysis, plan = _plan(run_option="herring", herring_buffer_bytes=40)
    assert {vp.method for vp in plan.variables} == {"herring"}
    layout = METHODS["herring"].state(plan).layout
    assert sorted(layout.order) == sorted(v.name for v in analysis.variables)
    assert layout.buffer_elements == 10   # 40 bytes of float32, a multiple of 2 servers
    sizes = dict(zip(layout.order, layout.sizes))
    for v in analysis.variables:
        covered = sum(s.length for b in layout.buffers for s in b.segments if s.variable == v.name)
        assert covered == sizes[v.name] == math.prod(v.shape)
        # the variable's element ranges with the server summing each cover it once
        vp = plan.variable(v.name)
        flat = sorted(map(tuple, vp.partitions))
        assert flat[0][0] == 0 and flat[-1][1] == sizes[v.name]
        assert all(x[1] == y[0] for x, y in zip(flat, flat[1:]))
    # two keys per buffer for the host-local collectives, none reused
    keys = [b.la_key + i for b in layout.buffers for i in (0, 1)]
    assert len(set(keys)) == len(keys) and min(b.key for b in plan.barriers) > max(keys)


def test_float64_gradients_stay_on_the_ring():
    analysis = analyze_graph(build_case("f64").graph)
    plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(run_option="herring"))
    methods = {vp.name: vp.method for vp in plan.variables}
    assert methods["wide/kernel"] == methods["wide/bias"] == "allreduce"
    assert "float32" in plan.variable("wide/kernel").reason
    assert methods["l1/kernel"] == methods["out/bias"] == "herring"
    assert "wide/kernel" not in METHODS["herring"].state(plan).layout.order


def test_herring_needs_servers():
    analysis = analyze_graph(build_case("mlp").graph)
    with pytest.raises(SpecError, match="servers"):
        make_plan(analysis, Topology.local(2), options=PlanOptions(run_option="herring"))


def test_sparse_variables_keep_their_path():
    analysis = analyze_graph(build_case("emb", "adam").graph)
    plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(run_option="herring"))
    assert plan.variable("embedding").method == "ps"
    assert plan.variable("head/kernel").method == "herring"


@pytest.mark.parametrize("hosts,servers,la,expected", [
    # 4 workers on 2 hosts, 2 servers: ring 2*3/4 = 1.5 M; herring max(1, 2/2) = 1 M
    ((1, 1, 2, 2), 2, True, True),
    # without local aggregation 4 contributors over 2 servers: 2 M per server link > 1.5
    ((1, 1, 2, 2), 2, False, False),
    # 2 workers: ring 1 M = herring 1 M, not faster
    ((1, 2), 2, True, False),
    # 8 hosts, 1 server: 8 M on its link against the ring's 1.75 M
    ((1, 2, 3, 4, 5, 6, 7, 8), 1, True, False),
    # no servers: the ring
    ((1, 1, 2, 2), 0, True, False),
])
def test_the_cost_model_compares_the_busiest_links_bytes(hosts, servers, la, expected):
    """For a model whose bytes matter (100 MB at 10 Gbit/s: 80 ms per M)."""
    faster, why = predicted_faster(len(hosts), len(set(hosts)), servers, la, "float32",
                                   100e6, 10.0)
    assert faster is expected, why
    if servers:
        assert ("herring is predicted faster by" in why) is expected, why


def test_a_tiny_model_keeps_the_ring_saying_by_how_much_herring_would_save():
    """The shape that sends a large model to herring (4 workers on 2 hosts, 2
    servers), for a model of 32 bytes: herring's busiest link would save
    16 bytes per step, far below what its servers must pay back."""
    faster, why = predicted_faster(4, 2, 2, True, "float32", 32, None)
    assert not faster
    assert why.startswith("cost model for M = 32 B of dense float32 gradients at 10 Gbit/s per "
                          "link (assumed: the spec gives none)"), why
    assert why.endswith("herring would save 0.000 ms per step, less than the 1 ms its servers "
                        "and buffers must pay back: ring all-reduce is kept"), why
    # The test model (a few KB) on real hosts: the same in a plan, and its report says why.
    topology = Topology(tuple(f"10.0.0.{h}" for h in (1, 1, 2, 2)), 2)
    case, analysis, plan = _plan(topology, run_option="hybrid")
    assert {vp.method for vp in plan.variables} == {"allreduce"}
    assert "less than the 1 ms its servers" in build_report(analysis, plan).table()
    # On a 1 Mbit/s link its bytes are worth it.
    slow = Topology(topology.worker_hosts, 2, link_gbps=0.001)
    _, _, plan = _plan(slow, run_option="hybrid")
    assert {vp.method for vp in plan.variables} == {"herring"}
    assert "herring is predicted faster by" in METHODS["herring"].state(plan).why


def test_every_worker_on_one_host_keeps_the_ring():
    """`-H node1:4 --servers-per-host 1`: the workers' ring never leaves the
    host, whatever the model; run_option='herring' still forces herring."""
    topology = Topology(("10.0.0.1",) * 4, 1, link_gbps=0.001)
    _, _, plan = _plan(topology, run_option="hybrid")
    assert {vp.method for vp in plan.variables} == {"allreduce"}
    assert "every worker runs on one host (10.0.0.1)" in METHODS["herring"].state(plan).why
    _, _, forced = _plan(topology, run_option="herring")
    assert {vp.method for vp in forced.variables} == {"herring"}


@pytest.mark.parametrize("option", ["ps", "allreduce"])
def test_run_options_without_herring_say_nothing_of_it(option):
    """Only a run option whose policy lists herring asks its cost model: the
    report of a ps or allreduce job on real hosts with servers (where
    hybrid's cost model speaks) has no herring line."""
    topology = Topology(("10.0.0.1", "10.0.0.2"), 2)
    case, analysis, plan = _plan(topology, run_option=option)
    assert "herring" not in {vp.method for vp in plan.variables}
    assert METHODS["herring"].state(plan).why == ""
    assert "herring:" not in build_report(analysis, plan).table()
    _, _, hybrid = _plan(topology, run_option="hybrid")
    assert "cost model" in METHODS["herring"].state(hybrid).why


@pytest.mark.parametrize("hosts", [("127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2"),
                                   ("localhost",) * 4])
def test_hybrid_keeps_the_ring_when_every_host_is_loopback(hosts):
    """The shape the cost model sends to herring on real hosts (first case
    above), on one machine: no link to save bytes on, so the ring; the
    herring run option still forces herring."""
    _, _, plan = _plan(Topology(hosts, 2), run_option="hybrid")
    assert {vp.method for vp in plan.variables} == {"allreduce"}
    assert "loopback" in METHODS["herring"].state(plan).why
    _, _, forced = _plan(Topology(hosts, 2), run_option="herring")
    assert {vp.method for vp in forced.variables} == {"herring"}


@pytest.mark.parametrize("wire, method", [("bfloat16", "herring"), ("float16", "allreduce")])
def test_hybrid_with_half_precision_wire(wire, method):
    """2 workers, 2 hosts, 2 servers (on a 1 Mbit/s link, where the test
    model's bytes are worth herring's servers): a half-precision wire halves
    herring's bytes to 0.5 M. bfloat16 leaves the ring at 1 M (TensorFlow's
    collectives carry no bfloat16), so herring; float16 halves the ring's
    too (0.5 M each), and a tie keeps the ring."""
    topology = Topology(("10.0.0.1", "10.0.0.2"), 2, link_gbps=0.001)
    _, _, plan = _plan(topology, run_option="hybrid", wire_dtype=wire)
    assert {vp.method for vp in plan.variables} == {method}
    assert {vp.wire_dtype for vp in plan.variables} == {wire}


def test_plan_json_round_trip():
    case, analysis, plan = _plan(run_option="herring", herring_buffer_bytes=40,
                                 wire_dtype="bfloat16")
    again = Plan.from_json(plan.to_json())
    assert again == plan
    assert isinstance(METHODS["herring"].state(again).layout, FusionLayout)
    assert isinstance(METHODS["herring"].state(again).layout.buffers[0].shards[0], Shard)
    compiled = CompiledPlan(analysis, plan)
    assert CompiledPlan.from_bytes(compiled.to_bytes()) == compiled


def test_layout_protobuf_round_trip():
    _, _, plan = _plan(run_option="herring", herring_buffer_bytes=40, wire_dtype="float16")
    msg = METHODS["herring"].state(plan).layout.to_proto()
    parsed = type(msg).FromString(msg.SerializeToString())
    assert FusionLayout.from_proto(parsed) == METHODS["herring"].state(plan).layout
    # the table as the C++ side reads it
    b0 = parsed.buffers[0]
    assert (b0.elements, [(s.server, s.offset, s.length) for s in b0.shards]) == (
        10, [(0, 0, 5), (1, 5, 5)])
    assert parsed.wire_dtype == "float16"


# ------------------------------------------------------------ config
def test_config_validation():
    assert Config(run_option="herring", wire_dtype="bfloat16").wire_dtype == "bfloat16"
    with pytest.raises(AutoparError, match="wire_dtype"):
        Config(wire_dtype="int8")
    with pytest.raises(AutoparError, match="herring_buffer_bytes"):
        Config(herring_buffer_bytes=0)
    options = Config(run_option="herring", herring_buffer_bytes=1024)
    assert (options.run_option, options.herring_buffer_bytes) == ("herring", 1024)


# ------------------------------------------------------------ the report
def test_report_buffers_and_bytes():
    """a(8) b(10) c(15) = 33 elements in buffers of 6 over 2 servers, 4 workers
    on 2 hosts with local aggregation: 2 contributors."""
    graph, _, _ = _chain_graph()
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, TWO_HOSTS,
                     options=PlanOptions(run_option="herring", herring_buffer_bytes=24))
    report = build_report(analysis, plan)
    # every contributor pushes and pulls the 33 elements once, 4 bytes each
    assert report.sent_per_worker == report.received_per_worker == 33 * 4
    # server 0 sums 3+3+3+3+3+2 = 17 elements, server 1 3+3+3+3+3+1 = 16,
    # from each of 2 contributors and back to each
    assert [(s["sent"], s["received"]) for s in report.servers] == [
        (2 * 17 * 4, 2 * 17 * 4), (2 * 16 * 4, 2 * 16 * 4)]
    b5 = report.herring_buffers[5]
    assert (b5["elements"], b5["segments"], b5["shards"]) == (
        3, [["c", 12, 0, 3]], [[0, 0, 2], [1, 2, 1]])
    table = report.table()
    assert "herring buffer #1: 6 elements" in table and "a[6:8]@0, b[0:4]@2" in table
    assert "run_option='herring'" in table
    # the same layout on a float16 wire: half the bytes
    plan16 = make_plan(analysis, TWO_HOSTS, options=PlanOptions(
        run_option="herring", herring_buffer_bytes=24, wire_dtype="float16"))
    assert build_report(analysis, plan16).sent_per_worker == 33 * 2


# ------------------------------------------------------------ the rewrite
class Recording(Herring):
    """The herring rewrite with a transport that records its calls and
    returns its input: the result of one contributor (mean or sum of one).
    The buffer's index and shards are recorded as the kernel gets them: from
    the FusionBuffer message."""

    def __init__(self):
        self.calls = []

    def transport(self):
        def push_pull(buffer, fusion_buffer, **kwargs):
            msg = fusion_buffer.to_proto()
            self.calls.append(dict(kwargs, buffer_id=msg.index,
                                   shards=[(s.server, s.offset, s.length) for s in msg.shards]))
            return tf.identity(buffer, name="one_contributor")
        return push_pull


def _rewrite(graph, analysis, plan, index, method):
    saved = METHODS["herring"]
    METHODS["herring"] = method
    try:
        return rewrite_for_worker(graph, analysis, plan, index)
    finally:
        METHODS["herring"] = saved


def test_unpacked_gradients_equal_the_local_ones_and_land_at_planned_offsets():
    """One worker: buffers packed, passed through, unpacked give every
    variable its own gradient back. The plan's order is not the order the
    graph produces the gradients in (c first, as if measured elsewhere): each
    gradient still lands at its planned offset."""
    graph, x, _ = _chain_graph()
    analysis = analyze_graph(graph)
    positions = {"c": 0, "a": 1, "b": 2}   # planned: c(15) a(8) b(10)
    for v in analysis.variables:
        v.grad_position = positions[v.name]
    plan = make_plan(analysis, Topology(("127.0.0.1",), 2),
                     options=PlanOptions(run_option="herring", herring_buffer_bytes=32))
    assert METHODS["herring"].state(plan).layout.order == ["c", "a", "b"]
    method = Recording()
    worker = _rewrite(graph, analysis, plan, 0, method)
    # 33 elements in buffers of 8 (32 bytes): 5 buffers, ids 0..4, the last of 1 element
    assert [c["buffer_id"] for c in method.calls] == [0, 1, 2, 3, 4]
    assert method.calls[0]["shards"] == [(0, 0, 4), (1, 4, 4)]
    assert method.calls[4]["shards"] == [(0, 0, 1)]
    # With local aggregation every contributor pushes a sum (a host of one
    # worker too) and the mean is taken after the pull: one average flag for all.
    assert all(c["num_contributors"] == 1 and c["contributor_index"] == 0 and not c["average"]
               for c in method.calls)
    out = tf.Graph()
    with out.as_default():
        tf1.train.import_meta_graph(worker.meta_graph, clear_devices=True)
        feed = {"x:0": np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)}
        names = [analysis.variable(n).grad_tensor for n in ("c", "a", "b")]
        buffers = [op.inputs[0] for op in out.get_operations()
                   if op.type == "Identity" and "one_contributor" in op.name]
        with tf1.Session(graph=out) as sess:
            sess.run(tf1.global_variables_initializer())
            local = sess.run(names, feed)
            replaced = sess.run([worker.replaced[n] for n in names], feed)
            packed = sess.run(buffers, feed)
    for mine, back in zip(local, replaced):
        np.testing.assert_array_equal(back, mine)
    stream = np.concatenate(packed)
    # by hand: c at [0, 15), a at [15, 23), b at [23, 33)
    np.testing.assert_array_equal(stream[0:15], local[0].ravel())
    np.testing.assert_array_equal(stream[15:23], local[1].ravel())
    np.testing.assert_array_equal(stream[23:33], local[2].ravel())


def test_hierarchy_one_contributor_per_host():
    """4 workers on 2 hosts with local aggregation: the first worker of each
    host pushes as contributor (host index) of 2, summing (the host's sums
    add up to the global sum, divided by 4 after); the others only reduce
    within the host and receive the broadcast."""
    case = build_case("mlp", "momentum")
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, TWO_HOSTS,
                     options=PlanOptions(run_option="herring", herring_buffer_bytes=64))
    buffers = len(METHODS["herring"].state(plan).layout.buffers)
    for index, contributor in ((0, 0), (1, None), (2, 1), (3, None)):
        method = Recording()
        worker = _rewrite(case.graph, analysis, plan, index, method)
        if contributor is None:
            assert method.calls == []
        else:
            assert [c["buffer_id"] for c in method.calls] == list(range(buffers))
            assert {(c["num_contributors"], c["contributor_index"], c["average"])
                    for c in method.calls} == {(2, contributor, False)}
        nodes = worker.meta_graph.graph_def.node
        reduces = [n for n in nodes if n.op == "CollectiveReduceV2" and "herring" in n.name]
        sends = [n for n in nodes if n.op == "CollectiveBcastSendV2" and "herring" in n.name]
        recvs = [n for n in nodes if n.op == "CollectiveBcastRecvV2" and "herring" in n.name]
        assert len(reduces) == buffers
        assert (len(sends), len(recvs)) == ((buffers, 0) if contributor is not None else (0, buffers))
        # A receiver reads only its host sum's static shape (a constant): its
        # host sum must still be among its inputs (data or control), else the
        # sum is pruned from the step and the leader waits in it forever.
        inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in nodes}
        for recv, reduce in zip(recvs, reduces):
            assert reduce.name in _ancestors(inputs, recv.name)


def _ancestors(inputs: dict, name: str) -> set:
    seen, stack = set(), [name]
    while stack:
        for i in inputs[stack.pop()]:
            if i not in seen:
                seen.add(i)
                stack.append(i)
    return seen


def test_no_local_aggregation_every_worker_contributes():
    case = build_case("mlp", "momentum")
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(
        run_option="herring", local_aggregation=False, loss_reduction="sum"))
    method = Recording()
    _rewrite(case.graph, analysis, plan, 3, method)
    assert len(method.calls) == len(METHODS["herring"].state(plan).layout.buffers) == 1   # a small model: one buffer
    assert (method.calls[0]["num_contributors"], method.calls[0]["contributor_index"],
            method.calls[0]["average"]) == (4, 3, False)
