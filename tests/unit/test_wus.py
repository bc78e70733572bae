"""Weight-update sharding: deterministic owners balanced by bytes, what a
non-owner's graph runs, where slots live, and the report (numbers against
one device and the checkpoint round trip:
tests/integration/test_weight_update_sharding.py)."""
import pytest

from autopar.common.errors import AutoparError
from autopar.config import Config
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker, worker_device
from autopar.transforms.wus import DONE_OP
from tests import models

SHARD = PlanOptions(run_option="allreduce", shard_weight_update=True)


def _case(name="mlp_adam_clip", workers=3):
    m = models.build(name)
    analysis = analyze_graph(m.graph)
    return m, analysis, make_plan(analysis, workers, options=SHARD)


def test_owners_balanced_by_bytes_and_deterministic():
    _, analysis, plan = _case()
    owners = {vp.name: vp.owner for vp in plan.variables}
    # largest first to the least loaded worker: 1.5 KB, 640 B, 128 B, 40 B
    assert owners == {"hidden/kernel": 0, "out/kernel": 1, "hidden/bias": 2, "out/bias": 2}
    assert make_plan(analysis, 3, options=SHARD).variables == plan.variables
    assert all(vp.owner is None for vp in make_plan(analysis, 3).variables)


def test_sparse_variables_are_not_sharded():
    _, _, plan = _case("emb_adam_clip")
    assert {vp.name: vp.owner for vp in plan.variables if vp.method != "allreduce"} == {
        "embedding": None}


@pytest.mark.parametrize("worker", [0, 2])
def test_non_owners_skip_the_update_and_slots_live_on_the_owner(worker):
    m, analysis, plan = _case()
    graph_def = rewrite_for_worker(m.graph, analysis, plan, worker).meta_graph.graph_def
    nodes = {n.name: n for n in graph_def.node}
    for vp in plan.variables:
        info = analysis.variable(vp.name)
        applies = [nodes[u] for u in info.update_ops if u.endswith("ResourceApplyAdam")]
        assert len(applies) == 1
        assert (applies[0].op == "ResourceApplyAdam") == (vp.owner == worker), vp.name
        for slot in info.slots:
            assert nodes[slot].device == worker_device(vp.owner)
    # The global step increment waits for the gathered values.
    step = [n.name for n in graph_def.node if n.op == "AssignAddVariableOp"
            and n.input[0] == "global_step"]
    assert len(step) == 1 and DONE_OP in _ancestors(nodes, step[0])


def _ancestors(nodes, name):
    seen, frontier = set(), [name]
    while frontier:
        for i in nodes[frontier.pop()].input:
            op = i.lstrip("^").split(":")[0]
            if op not in seen:
                seen.add(op)
                frontier.append(op)
    return seen


def test_report_says_who_updates_what_and_slot_bytes_fall():
    _, analysis, plan = _case()
    report = build_report(analysis, plan)
    assert [v.owner for v in report.variables] == [0, 2, 1, 2]
    # Adam: two slots per variable, float64 model; hidden/kernel 12x16.
    assert report.slot_bytes == [2 * 12 * 16 * 8, 2 * 16 * 5 * 8, 2 * (16 + 5) * 8]
    assert report.slot_bytes_unsharded == [sum(report.slot_bytes)] * 3
    text = report.table()
    assert "hidden/kernel" in text and "updated by worker 0 (weight-update sharding)" in text
    assert "worker 1: updates 1 variable(s), holds 1.2 KB of optimizer slots (4.6 KB unsharded)" in text


def test_servers_are_refused():
    m = models.build("emb_adam_clip")
    with pytest.raises(AutoparError, match="parameter servers .*embedding"):
        make_plan(analyze_graph(m.graph), Topology.local(3, num_servers=2),
                  options=PlanOptions(run_option="hybrid", shard_weight_update=True))


def test_config_validation():
    with pytest.raises(AutoparError, match="shard_weight_update"):
        Config(shard_weight_update="yes")
