"""2-D summation of the all-reduce buckets, by hosts and over groups of
workers: when it is chosen (transforms.methods.allreduce.method.two_dimensional_choice,
transforms.plan.allreduce_structure), the plan's keys and the report, and
the collectives each worker's rewritten graph holds."""
import pytest
from tensorflow.core.framework import graph_pb2

from autopar.common.errors import AutoparError
from autopar.config import Config
from autopar.transforms.accelerator import Accelerator
from autopar.transforms.comm import collective_rank
from autopar.transforms.methods.allreduce.method import host_link_bytes
from autopar.transforms.methods.allreduce.method import two_dimensional_choice
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.keys import (ACCELERATOR_GROUPS, ALLREDUCE_COLUMNS, ALLREDUCE_GROUPS,
                                     GROUP_KEY, LEADERS_GROUP_KEY)
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.methods.registry import METHODS
from tests import models
from tests.unit.test_plan_report import all_keys

TWO_BY_TWO = Topology(("a", "a", "b", "b"))
TWO_PLUS_ONE = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"))


@pytest.mark.parametrize("hosts, option, chosen", [
    (("a", "a", "b", "b"), None, True),    # busiest link 1.5 b (ring) vs b (2-D)
    (("a", "a", "b"), None, True),         # 4/3 b vs b
    (("a", "b", "a", "b"), None, True),    # interleaved: 3 b vs b
    (("a", "b", "c"), None, False),        # one worker per host: nothing to sum in a host
    (("a", "a", "a"), None, False),        # one host: no link to save
    (("a", "a", "a"), True, True),         # forced on
    (("a", "a", "b", "b"), False, False),  # forced off
])
def test_choice(hosts, option, chosen):
    got, why = two_dimensional_choice(Topology(hosts), option)
    assert got is chosen
    assert why


def test_auto_choice_compares_the_busiest_host_link():
    _, why = two_dimensional_choice(TWO_BY_TWO, None)
    assert "flat ring 1.50" in why and "2-D summation 1.00" in why


def _plan(topology, options_type=PlanOptions, **options):
    case = models.build("mlp_adam_clip")
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, topology,
                     options=options_type(run_option="allreduce", fusion_bytes=256, **options))
    return case, analysis, plan


def test_plan_gives_every_bucket_its_own_keys_and_the_report_names_the_buckets():
    _, analysis, plan = _plan(TWO_BY_TWO)
    assert len(METHODS["allreduce"].state(plan).buckets) > 1 and all(b.hierarchical for b in METHODS["allreduce"].state(plan).buckets)
    keys = all_keys(plan)   # with the host sums and broadcasts
    keys += [b.key for b in plan.barriers] + [plan.broadcast_key_base]
    assert len(keys) == len(set(keys))
    table = build_report(analysis, plan).table()
    indices = ", ".join(f"#{b.index}" for b in METHODS["allreduce"].state(plan).buckets)
    assert "2-D summation (sum within each host" in table
    assert f"for bucket(s) {indices}:" in table
    assert "(2-D summation); the flat ring in worker order would send" in table
    assert table.count("fused into one all-reduce (2-D summation)") == len(METHODS["allreduce"].state(plan).buckets)
    # Forced off: the flat ring, the 2-D figure given for comparison.
    _, analysis, flat = _plan(TWO_BY_TWO, hierarchical_allreduce=False)
    assert not any(b.hierarchical for b in METHODS["allreduce"].state(flat).buckets)
    table = build_report(analysis, flat).table()
    assert "flat ring all-reduce for every bucket: Config(hierarchical_allreduce=False)" in table
    assert "(ring in worker order); 2-D summation would send" in table
    assert "(2-D summation)\n" not in table


def _collectives(graph_def: graph_pb2.GraphDef) -> list[tuple]:
    """(node, op type, group key, group size) of each collective."""
    consts = {n.name: n.attr["value"].tensor.int_val for n in graph_def.node if n.op == "Const"}
    out = []
    for n in graph_def.node:
        if n.op.startswith("Collective"):
            data = [i for i in n.input if not i.startswith("^")]
            offset = 0 if n.op == "CollectiveBcastRecvV2" else 1
            size, key = (consts[data[offset + j].split(":")[0]][0] for j in (0, 1))
            out.append((n, n.op, key, size))
    return out


@pytest.mark.parametrize("worker", [0, 1, 2])
def test_each_worker_builds_its_host_and_leader_steps(worker):
    # a Config's collectives wait at most its peer_timeout_s
    case, analysis, plan = _plan(TWO_PLUS_ONE, Config, hierarchical_allreduce=True,
                                 stall_timeout_s=7.0, busy_timeout_s=7.0)
    graph_def = rewrite_for_worker(case.graph, analysis, plan, worker).meta_graph.graph_def
    host_key, members = plan.host_group(worker)
    steps = [(op, key, size) for node, op, key, size in _collectives(graph_def)
             if key != GROUP_KEY]   # the initial-state broadcast uses the job's group
    n = len(METHODS["allreduce"].state(plan).buckets)
    if worker == 0:      # host sum, leaders' all-reduce, broadcast send per bucket
        expected = [("CollectiveReduceV2", host_key, 2), ("CollectiveReduceV2", LEADERS_GROUP_KEY, 2),
                    ("CollectiveBcastSendV2", host_key, 2)]
    elif worker == 1:    # host sum, broadcast receive
        expected = [("CollectiveReduceV2", host_key, 2), ("CollectiveBcastRecvV2", host_key, 2)]
    else:                # alone on its host: only the leaders' all-reduce
        expected = [("CollectiveReduceV2", LEADERS_GROUP_KEY, 2)]
    assert sorted(steps) == sorted(expected * n)
    by_name = {node.name: node for node in graph_def.node}
    for node, op, key, _ in _collectives(graph_def):
        if key == GROUP_KEY:
            continue
        assert node.attr["timeout_seconds"].f == 7.0   # bounded waits
        if op == "CollectiveBcastRecvV2":
            # The receiver reads only its host sum's static shape (a constant):
            # a control edge keeps the sum, which the leader waits in, in the step.
            shape = by_name[node.input[3].split(":")[0]]
            controls = [i[1:] for n in (node, shape) for i in n.input if i.startswith("^")]
            assert any(by_name[c].op == "CollectiveReduceV2" for c in controls), node
    # Per group and kind, one launch order on every member: each bucket's op
    # waits for the previous bucket's (in instance-key order, as planned);
    # the edge sits on the op or on its instance-key constant.
    kinds: dict = {}
    for node, op, key, _ in _collectives(graph_def):
        if key != GROUP_KEY:
            data = [i for i in node.input if not i.startswith("^")]
            instance = by_name[data[2 if op == "CollectiveBcastRecvV2" else 3]]
            kinds.setdefault((op, key), []).append(
                (instance.attr["value"].tensor.int_val[0], node, instance))
    for chain in kinds.values():
        chain.sort(key=lambda t: t[0])
        for (_, before, _), (_, after, constant) in zip(chain, chain[1:]):
            assert "^" + before.name in [*after.input, *constant.input], (before.name, after.name)


# --- 2-D summation over groups of workers (Config.allreduce_group)

FOUR_HOSTS = Topology(tuple(f"10.0.0.{i + 1}" for i in range(4)), link_gbps=1.0)


@pytest.mark.parametrize("worker", [0, 1, 2, 3])
def test_each_worker_exchanges_in_its_group_and_reduces_in_its_column(worker):
    case, analysis, plan = _plan(FOUR_HOSTS, Config, allreduce_group=2, stall_timeout_s=7.0,
                                 busy_timeout_s=7.0)
    buckets = METHODS["allreduce"].state(plan).buckets
    assert len(buckets) > 1 and all(b.hierarchical for b in buckets)
    graph_def = rewrite_for_worker(case.graph, analysis, plan, worker).meta_graph.graph_def
    steps = [(op, key, size) for _, op, key, size in _collectives(graph_def) if key != GROUP_KEY]
    # groups [0, 1] and [2, 3]; columns [0, 2] and [1, 3]
    row, column = ALLREDUCE_GROUPS.key(worker // 2), ALLREDUCE_COLUMNS.key(worker % 2)
    assert sorted(steps) == sorted([("CollectiveAllToAllV2", row, 2),
                                    ("CollectiveReduceV2", column, 2),
                                    ("CollectiveGatherV2", row, 2)] * len(buckets))
    for node, op, key, _ in _collectives(graph_def):
        if key != GROUP_KEY:
            assert node.attr["timeout_seconds"].f == 7.0 or op == "CollectiveGatherV2"
    keys = all_keys(plan) + [b.key for b in plan.barriers] + [plan.broadcast_key_base]
    assert len(keys) == len(set(keys))


def test_a_gpu_worker_exchanges_on_its_gpu_in_its_groups_twin():
    case, analysis, plan = _plan(FOUR_HOSTS, allreduce_group=2)
    graph_def = rewrite_for_worker(case.graph, analysis, plan, 1,
                                   accelerator=Accelerator()).meta_graph.graph_def
    exchanges = [(node, key) for node, op, key, _ in _collectives(graph_def)
                 if op == "CollectiveAllToAllV2"]
    assert exchanges
    for node, key in exchanges:   # float64 buckets: NCCL's, in the group's GPU twin
        assert node.device.endswith("device:GPU:0")
        assert key == ACCELERATOR_GROUPS.first + ALLREDUCE_GROUPS.key(0)
        assert node.attr["communication_hint"].s == b"nccl"


def test_a_hand_set_group_is_reported_and_must_divide_the_workers():
    _, analysis, plan = _plan(FOUR_HOSTS, allreduce_group=2)
    table = build_report(analysis, plan).table()
    indices = ", ".join(f"#{b.index}" for b in METHODS["allreduce"].state(plan).buckets)
    assert ("2-D summation over groups of 2 workers (each group exchanges the 2 pieces of its "
            "sums, the workers at one place of every group all-reduce that piece across the 2 "
            f"groups, each group gathers its pieces) for bucket(s) {indices}: "
            "Config(allreduce_group=2)") in table
    with pytest.raises(AutoparError, match=r"Config.allreduce_group=3 must divide the job's 4"):
        _plan(FOUR_HOSTS, allreduce_group=3)
    with pytest.raises(AutoparError, match="Config.allreduce_group and Config.hierarchical_"):
        Config(allreduce_group=2, hierarchical_allreduce=True)
    with pytest.raises(AutoparError, match="Config.allreduce_group must be a group size"):
        Config(allreduce_group=-1)


def _hosts(n):
    return Topology(tuple(f"10.0.{i // 200}.{i % 200 + 1}" for i in range(n)), link_gbps=1.0)


@pytest.mark.parametrize("topology, chosen, why", [
    (_hosts(256), True, "x faster)"),           # 2(N - 1) ring steps bind
    (_hosts(3), False, "no group of a power of 2 divides the 3 workers"),
    (Topology(("127.0.0.1",) * 256), False, "loopback"),
])
def test_the_planner_chooses_groups_where_the_rings_steps_bind(topology, chosen, why):
    _, analysis, plan = _plan(topology)
    state = METHODS["allreduce"].state(plan)
    assert (state.group > 1) is chosen and why in state.hierarchical_why
    if chosen:
        assert topology.num_workers % state.group == 0 and all(b.hierarchical for b in state.buckets)
        assert "groups of " in state.hierarchical_why
        assert f"2-D summation over groups of {state.group} workers" in \
            build_report(analysis, plan).table()
    else:
        assert not any(b.hierarchical for b in state.buckets)


def test_hosts_of_several_workers_keep_the_hosts_2d_summation():
    _, _, plan = _plan(Topology(tuple(f"10.0.0.{i // 2 + 1}" for i in range(256)),
                                link_gbps=1.0))
    state = METHODS["allreduce"].state(plan)
    assert state.group == 0 and all(b.hierarchical for b in state.buckets)
    assert "(128 hosts, up to 2 workers each): 2-D summation sends fewer" in state.hierarchical_why


def test_hierarchical_allreduce_set_either_way_leaves_the_groups_unchosen():
    for option in (True, False):
        _, _, plan = _plan(_hosts(256), hierarchical_allreduce=option)
        state = METHODS["allreduce"].state(plan)
        assert state.group == 0 and all(b.hierarchical is option for b in state.buckets)
        assert state.hierarchical_why == f"Config(hierarchical_allreduce={option})"


def test_a_workers_rank_in_a_group_is_its_device_names_lexicographic_place():
    # TensorFlow ranks a collective group's members by their device names
    assert [collective_rank(w, range(4)) for w in range(4)] == [0, 1, 2, 3]
    assert [collective_rank(w, range(8, 12)) for w in range(8, 12)] == [2, 3, 0, 1]
    assert collective_rank(10, range(12)) == 2 and collective_rank(2, range(12)) == 4
    assert collective_rank(1, [1, 10, 100]) == 0


def test_in_a_group_of_tasks_past_9_the_column_follows_the_rank():
    topology = Topology(tuple(f"10.0.0.{i + 1}" for i in range(12)), link_gbps=1.0)
    case, analysis, plan = _plan(topology, allreduce_group=4)
    graph_def = rewrite_for_worker(case.graph, analysis, plan, 8).meta_graph.graph_def
    columns = {key for _, op, key, _ in _collectives(graph_def) if op == "CollectiveReduceV2"
               and key != GROUP_KEY}
    assert columns == {ALLREDUCE_COLUMNS.key(2)}   # task 8 ranks third in [8, 9, 10, 11]


def test_the_flat_rings_host_links_follow_the_ranks_order():
    # 6 + 6 workers listed host by host: the ring goes 0, 1, 10, 11, 2, ..., 9
    # (device names as text), so it leaves each host twice, not once
    hosts = ("a",) * 6 + ("b",) * 6
    per_edge = 2 * 11 / 12
    assert host_link_bytes(hosts, 1.0) == pytest.approx({"a": 2 * per_edge, "b": 2 * per_edge})
    assert host_link_bytes(("a",) * 2 + ("b",) * 2, 1.0) == pytest.approx({"a": 1.5, "b": 1.5})
