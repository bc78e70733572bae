"""Config(aggregation_group=k): groups of k consecutive workers meet the
parameter servers together in place of the hosts. Planned and rewritten
here, without a cluster (the trained result against one device:
tests/integration/test_hybrid.py):

- the groups, their collective keys and the contributions a server expects;
- a partitioned sparse variable's lookup is pulled from the servers by the
  group's first worker only, which sends each member its rows;
- what cannot work is refused, naming the setting.
"""
import numpy as np
import pytest
import tensorflow as tf

import autopar
from autopar.common.errors import AutoparError
from autopar.runtime.runner import Runner
from autopar.transforms import keys
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.topology import Topology
from tests import models

tf1 = tf.compat.v1
# 5 workers on 2 hosts (3 + 2), 2 servers
TOPOLOGY = Topology(("127.0.0.1",) * 3 + ("127.0.0.2",) * 2, num_servers=2)


def _plan(model, **options):
    analysis = analyze_graph(model.graph)
    options = {"run_option": "hybrid", "partitions": {"embedding": 2}, **options}
    return analysis, make_plan(analysis, TOPOLOGY, options=PlanOptions(**options))


def test_groups_of_consecutive_workers_replace_the_hosts():
    _, plan = _plan(models.build("lm_adam_clip"), aggregation_group=2)
    groups = [plan.push_group(w) for w in range(5)]
    assert [members for _, members in groups] == [[0, 1], [0, 1], [2, 3], [2, 3], [4]]
    assert [key for key, _ in groups] == [keys.AGGREGATION_GROUPS.key(g) for g in (0, 0, 1, 1, 2)]
    assert plan.contributions_per_step() == 3
    # the hosts' groups stay what the rings use (2-D summation, herring)
    assert plan.host_group(2)[1] == [0, 1, 2]
    _, hosts = _plan(models.build("lm_adam_clip"))
    assert hosts.push_group(2) == hosts.host_group(2) and hosts.contributions_per_step() == 2
    assert not hosts.grouped_lookups()


def test_only_a_partitioned_sparse_variable_gets_keys_for_its_grouped_lookup():
    _, plan = _plan(models.build("lm_adam_clip"), aggregation_group=2)
    assert plan.grouped_lookups() == ["embedding"]
    used = [k for v in plan.variables for k in v.keys.values()]
    assert len(used) == len(set(used))
    _, whole = _plan(models.build("lm_adam_clip"), aggregation_group=2,
                     partitions={"embedding": 1})
    assert whole.grouped_lookups() == []
    _, single = _plan(models.build("lm_adam_clip"), aggregation_group=1)
    assert single.grouped_lookups() == [] and single.contributions_per_step() == 5


def _server_gathers(nodes, variable="embedding"):
    """Row reads on the servers of `variable`'s partitions."""
    parts = {n.name for n in nodes if n.op == "VarHandleOp"
             and n.attr["shared_name"].s.decode().startswith(f"{variable}/part_")}
    return [n.name for n in nodes if n.op == "ResourceGather" and n.device.startswith("/job:ps")
            and n.input[0].split(":")[0] in parts]


def test_a_group_reads_the_rows_from_the_servers_once():
    model = models.build("lm_adam_clip")
    analysis, plan = _plan(model, aggregation_group=2)
    for worker, pulls in ((0, 2), (1, 0), (2, 2), (3, 0), (4, 2)):
        nodes = rewrite_for_worker(model.graph, analysis, plan, worker).meta_graph.graph_def.node
        assert len(_server_gathers(nodes)) == pulls, worker
        gathers = [n for n in nodes if n.op == "CollectiveGatherV2"]
        # the lookup's ids and the push's rows: a count and two ladders each
        assert len(gathers) == (0 if worker == 4 else 6), worker
        groups = {i.split(":")[0] for n in gathers for i in n.input[2:3]}
        assert len(groups) == (1 if gathers else 0)
        # each member's rows: scattered by the group's first worker (its blocks
        # from the union's rows), one all-to-all on every member of a group
        scatters = [n for n in nodes if n.op == "CollectiveAllToAllV2"
                    and n.name.startswith("autopar/partition/")]
        filled = [n for n in nodes if n.op == "ScatterNd" and n.name.startswith("autopar/partition/")]
        assert (len(scatters), len(filled)) == {0: (1, 1), 2: (1, 1), 4: (0, 0)}.get(worker, (1, 0))


def test_without_groups_every_worker_reads_its_rows():
    model = models.build("lm_adam_clip")
    analysis, plan = _plan(model)
    for worker in range(5):
        nodes = rewrite_for_worker(model.graph, analysis, plan, worker).meta_graph.graph_def.node
        assert len(_server_gathers(nodes)) == 2


@pytest.mark.parametrize("options, message", [
    (dict(aggregation_group=6), "from 1 to the job's 5 workers"),
    (dict(aggregation_group=2, local_aggregation=False), "needs Config.local_aggregation=True"),
])
def test_refused_groupings_name_the_setting(options, message):
    with pytest.raises(AutoparError, match="Config.aggregation_group") as info:
        _plan(models.build("lm_adam_clip"), **options)
    assert message in str(info.value)


def test_groups_are_refused_with_micro_batches():
    with pytest.raises(AutoparError, match="Config.aggregation_group .* Config.micro_batches > 1"):
        autopar.Config(aggregation_group=2, micro_batches=2)
    autopar.Config(aggregation_group=1, micro_batches=2)     # groups of one pull alone
    autopar.Config(aggregation_group=0, micro_batches=2)     # the hosts


def test_the_hosts_need_no_local_aggregation():
    """aggregation_group=0 keeps the hosts, which also holds without local
    aggregation (every worker a contributor); a group size needs it."""
    _, plan = _plan(models.build("lm_adam_clip"), aggregation_group=0, local_aggregation=False)
    assert plan.aggregation_group == 0 and plan.contributions_per_step() == 5


def test_evaluate_refuses_grouped_lookups():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [4], name="x")
        total, count = tf.reduce_sum(x), tf.size(x)
    runner = Runner(tf1.Session(graph=graph), graph, None, worker_index=0, num_workers=2,
                    lockstep_lookups=["embedding"])
    with pytest.raises(AutoparError, match="aggregation_group.*embedding"):
        runner.evaluate({"mean": (total, count)}, {x: np.zeros(4, np.float32)}, max_batches=1)
    runner.close()


# --- the planner's choice when Config.aggregation_group is None (transforms.plan
# aggregation_structure): one worker per host on a network, an embedding split
# over the servers

def _embedding_graph():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int64, [256], name="ids")
        y = tf1.placeholder(tf.float32, [256, 8], name="y")
        table = tf1.get_variable("embedding", [200_000, 64], use_resource=True)
        kernel = tf1.get_variable("kernel", [64, 8], use_resource=True)
        out = tf.matmul(tf.nn.embedding_lookup(table, ids), kernel)
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.square(out - y)))
    return graph


def _hosts(n, per_host=1, servers=None, **kw):
    return Topology(tuple(f"10.0.{i // per_host // 200}.{i // per_host % 200 + 1}"
                          for i in range(n)), n if servers is None else servers,
                    missing_processes=(("sumserver", ""),), **kw)


def _structure(topology, **options):
    analysis = analyze_graph(_embedding_graph())
    # a Config, as a user's: micro_batches is a Config field (DropCompute)
    plan = make_plan(analysis, topology, options=autopar.Config(run_option="hybrid", **options))
    return plan, build_report(analysis, plan)


def test_where_a_servers_messages_bind_the_plan_chooses_groups_and_fewer_servers():
    plan, report = _structure(_hosts(256, link_gbps=1.0))
    assert plan.aggregation_group > 1 and 0 < plan.sparse_servers < 256
    assert plan.grouped_lookups() == ["embedding"]
    assert plan.contributions_per_step() == 256 // plan.aggregation_group
    embedding = plan.variable("embedding")
    assert embedding.servers == list(range(plan.sparse_servers))
    assert len(embedding.partitions) == plan.sparse_servers
    note = next(n for n in report.notes if n.startswith("aggregation structure: "))
    assert f"groups of {plan.aggregation_group} workers" in note
    assert f"{plan.sparse_servers} of the 256 servers" in note and "x faster" in note
    assert (report.aggregation_group, report.sparse_servers) == (plan.aggregation_group,
                                                                plan.sparse_servers)
    grouped = next(n for n in report.notes if n.startswith("lookups of embedding"))
    assert grouped.endswith("the planner's choice, Config(aggregation_group=0) keeps the hosts")


@pytest.mark.parametrize("group", [0, 2])
def test_a_hand_set_group_wins(group):
    plan, report = _structure(_hosts(256, link_gbps=1.0), aggregation_group=group)
    assert (plan.aggregation_group, plan.sparse_servers) == (group, 0)
    assert plan.variable("embedding").servers == list(range(256))
    assert plan.structure_why == f"Config(aggregation_group={group})"


@pytest.mark.parametrize("topology, options, why", [
    (_hosts(4, link_gbps=1.0), {}, "the hosts and every server ("),
    (Topology(("127.0.0.1",) * 64, 64, missing_processes=(("sumserver", ""),)), {}, "loopback"),
    (_hosts(256, link_gbps=1.0), dict(local_aggregation=False), "local_aggregation=False"),
])
def test_small_jobs_loopback_and_no_local_aggregation_keep_the_hosts(topology, options, why):
    plan, _ = _structure(topology, **options)
    assert (plan.aggregation_group, plan.sparse_servers) == (0, 0)
    assert why in plan.structure_why
    assert plan.variable("embedding").servers == list(range(topology.num_servers))


@pytest.mark.parametrize("topology, options", [
    (_hosts(256, link_gbps=1.0), dict(micro_batches=2)),        # a lookup per micro-batch
    (_hosts(512, per_host=2, link_gbps=1.0), {}),               # hosts of several workers
])
def test_no_groups_where_they_are_not_modelled_or_cannot_run(topology, options):
    plan, _ = _structure(topology, **options)
    assert plan.aggregation_group == 0 and not plan.grouped_lookups()


def test_dense_variables_on_servers_keep_the_hosts():
    analysis = analyze_graph(_embedding_graph())
    plan = make_plan(analysis, _hosts(256, link_gbps=1.0), options=PlanOptions(run_option="ps"))
    assert (plan.aggregation_group, plan.sparse_servers) == (0, 0)
    assert "dense variables live on the servers (kernel)" in plan.structure_why
