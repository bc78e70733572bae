"""Config(aggregation_group=k): groups of k consecutive workers meet the
parameter servers together in place of the hosts. Planned and rewritten
here, without a cluster (the trained result against one device:
tests/integration/test_hybrid.py):

- the groups, their collective keys and the contributions a server expects;
- a partitioned sparse variable's lookup is pulled from the servers by the
  group's first worker only, the others reading the group's gathered rows;
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
        # the union's rows: sent by the group's first worker, received by the others
        sends = [n for n in nodes if n.op == "CollectiveBcastSendV2"
                 and n.name.startswith("autopar/partition/")]
        receives = [n for n in nodes if n.op == "CollectiveBcastRecvV2"
                    and n.name.startswith("autopar/partition/")]
        assert (len(sends), len(receives)) == {0: (1, 0), 2: (1, 0), 4: (0, 0)}.get(worker, (0, 1))


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
