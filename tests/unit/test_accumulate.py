"""transforms.accumulate through rewrite_for_worker(micro_batches=M): pure
graph checks that the accumulate ops stay local and the update reads only
the accumulators. (Numbers: tests/integration/test_dropcompute.py.)"""
import pytest
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.accumulate import ACCUMULATE_FIRST_OP, ACCUMULATE_OP
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import make_plan
from autopar.transforms.rewrite import rewrite_for_worker
from tests.models import build_case
from tests.unit.test_rewrite import all_ancestors, import_meta

tf1 = tf.compat.v1

COLLECTIVE_TYPES = ("CollectiveReduceV2", "CollectiveGatherV2", "CollectiveBcastSendV2",
                    "CollectiveBcastRecvV2", "CollectiveReduce", "CollectiveGather")


def _rewritten(micro_batches=4, **case):
    built = build_case(**case)
    analysis = analyze_graph(built.graph)
    plan = make_plan(analysis, 2)
    with built.graph.as_default():
        wg = rewrite_for_worker(built.graph, analysis, plan, 1, micro_batches=micro_batches)
    return built, analysis, wg, import_meta(wg.meta_graph)


@pytest.mark.parametrize("case", [dict(kind="mlp", optimizer="adam", minimize=True),
                                  dict(kind="emb", optimizer="adagrad", clip=True, ema=True)],
                         ids=["mlp-adam", "emb-adagrad-clip-ema"])
def test_update_reads_accumulators_and_accumulation_is_local(case):
    built, analysis, wg, g = _rewritten(**case)
    assert (wg.accumulate_first, wg.accumulate) == (ACCUMULATE_FIRST_OP, ACCUMULATE_OP)
    inputs = {op.name for op in g.get_operations() if op.type == "Placeholder"}
    assert inputs
    update = all_ancestors(g.get_operation_by_name(built.train_op.name))
    # The apply run computes no forward pass: no input, no gradient op.
    assert not update & inputs
    grad_ops = {t.split(":")[0] for v in analysis.variables
                for t in (v.grad_tensor, v.grad_values, v.grad_indices) if t}
    assert not update & grad_ops
    # ... and it aggregates through the collectives, which read accumulators.
    collectives = [op for op in g.get_operations() if op.type in COLLECTIVE_TYPES
                   and "broadcast" not in op.name]
    assert collectives and all(op.name in update for op in collectives)
    sums = {op.name for op in g.get_operations()
            if op.name.startswith("autopar/accumulate/sum_")}
    assert len(sums) == len(analysis.dense) + 2 * len(analysis.sparse)
    assert sums <= update
    for name in (ACCUMULATE_FIRST_OP, ACCUMULATE_OP):
        acc = all_ancestors(g.get_operation_by_name(name))
        assert inputs <= acc and grad_ops <= acc          # one micro-batch's gradients
        assert not any(g.get_operation_by_name(o).type in COLLECTIVE_TYPES for o in acc)
        assert built.train_op.name not in acc


def test_sparse_gradient_accumulates_as_rows():
    _, analysis, _, g = _rewritten(kind="emb", optimizer="sgd")
    sparse = analysis.sparse
    assert sparse
    handles = [op for op in g.get_operations() if op.type == "VarHandleOp"
               and op.name.startswith("autopar/accumulate/acc_")]
    shapes = {op.name: tf.TensorShape(op.get_attr("shape")) for op in handles}
    rows = [s for n, s in shapes.items() if n.endswith("_values")]
    # One growing [rows, dim] buffer of values and one of indices per sparse gradient.
    assert len(rows) == len(sparse) and all(s[0] is None and s[1] == 5 for s in rows)
    assert sum(n.endswith("_indices") for n in shapes) == len(sparse)


def test_one_micro_batch_builds_no_accumulators():
    _, _, wg, g = _rewritten(micro_batches=1, kind="mlp", optimizer="sgd")
    assert wg.accumulate is None
    assert not [op for op in g.get_operations() if op.name.startswith("autopar/accumulate")]


def test_update_that_reads_the_input_is_refused():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 2])
        h = tf.matmul(x, w)
        moving = tf1.get_variable("moving_mean", [2], trainable=False)
        stat = moving.assign_sub((moving - tf.reduce_mean(h, 0)) * 0.1)
        loss = tf.reduce_mean(tf.square(h))
        with tf.control_dependencies([stat]):
            train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze_graph(graph)
    with graph.as_default(), pytest.raises(UnsupportedGraphError, match="micro_batches") as e:
        rewrite_for_worker(graph, analysis, make_plan(analysis, 2), 0, micro_batches=2)
    # the path from the input to the step's op that reads it, whatever its length
    assert "through x -> MatMul -> " in str(e.value) and f"-> {stat.name}" in str(e.value)
    del train
