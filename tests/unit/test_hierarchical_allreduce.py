"""2-D summation of the all-reduce buckets: when it is chosen
(transforms.methods.allreduce.method.two_dimensional_choice), the plan's keys and the
report, and the collectives each worker's rewritten graph holds."""
import pytest
from tensorflow.core.framework import graph_pb2

from autopar.config import Config
from autopar.transforms.methods.allreduce.method import two_dimensional_choice
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.keys import GROUP_KEY, LEADERS_GROUP_KEY
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
