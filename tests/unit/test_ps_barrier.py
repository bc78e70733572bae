"""The end-of-step barrier of the parameter-server path (transforms.methods.ps.rewrite) waits
for every op of a training step that touches a server: ops on a server and
worker ops reading a server op's output. Workers' runs share a step id, and a
worker whose run ends cleans that id up on the servers, so server traffic of
a peer not ordered before the barrier could be aborted ("Cleanup <step id>").
"""
import pytest

from tests import models
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.rewrite import rewrite_for_worker

TWO_HOSTS = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), num_servers=2)


def ancestors(producers: dict, roots) -> set:
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(producers[name])
    return seen


@pytest.mark.parametrize("model,run_option,partitions", [
    # EMA of server variables: worker ops read them after the update.
    ("emb_adam_clip_ema", "ps", {}),
    ("emb_adam_clip_ema", "hybrid", {}),
    # Partition copies of the update region, placed on servers in the rewrite.
    ("lm_adagrad_clip", "ps", {"embedding": 3, "softmax/kernel": 2}),
])
def test_barrier_waits_for_all_server_work_of_the_step(model, run_option, partitions):
    m = models.build(model)
    analysis = analyze_graph(m.graph)
    plan = make_plan(analysis, TWO_HOSTS,
                     options=PlanOptions(run_option=run_option, partitions=partitions))
    for worker in range(3):
        wg = rewrite_for_worker(m.graph, analysis, plan, worker)
        nodes = {n.name: n for n in wg.meta_graph.graph_def.node}
        producers = {name: [i.lstrip("^").split(":")[0] for i in n.input]
                     for name, n in nodes.items()}

        def on_server(name):
            return nodes[name].device.startswith("/job:ps")

        step = ancestors(producers, [m.train_op.name, m.loss.op.name])
        touching = {n for n in step if on_server(n) or any(on_server(p) for p in producers[n])}
        assert any(not on_server(n) for n in touching)   # server reads consumed on the worker
        [(_, barrier)] = wg.step_barriers   # one train op: one barrier
        # Step targets: a NoOp on a server over a worker's pushes there (and
        # their counts), which the chief takes before it releases anyone.
        targets = [op for _, op in wg.step_targets]
        for t in targets:
            assert nodes[t].op == "NoOp" and on_server(t), t
            assert all(i.startswith("^") and nodes[i[1:]].device == nodes[t].device
                       and nodes[i[1:]].op in ("AccumulatorApplyGradient",
                                               "SparseAccumulatorApplyGradient",
                                               "AssignAddVariableOp") for i in nodes[t].input), t
        before_barrier = ancestors(producers, [barrier]) | ancestors(producers, targets)
        assert touching <= before_barrier, (worker, sorted(touching - before_barrier))
