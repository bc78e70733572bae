"""Distributed batch normalisation: which layers the analysis recognises, the
group sizes the plan accepts, and what the rewrite reads (the numbers
against one device: tests/integration/test_aggregation.py)."""
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from autopar.common.errors import AutoparError, UnsupportedGraphError
from autopar.config import Config
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.keys import BATCH_NORM_GROUPS, GROUP_KEY
from autopar.transforms.lower_cond import lowered_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.report import build_report
from autopar.transforms.rewrite import rewrite_for_worker
from tests import models
from tests.unit.local_run import run_locally

tf1 = tf.compat.v1


def _keras_graph(training=True, weight_moments=False):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4, 4, 2], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        h = keras.layers.BatchNormalization(name="kbn")(x, training=training)
        w = tf1.get_variable("w", [32, 3])
        if weight_moments:   # weight standardisation: moments of a variable, not of the batch
            mean, var = tf.nn.moments(w, [0])
            w = (w - mean) * tf.math.rsqrt(var + 1e-3)
        logits = tf.matmul(tf.reshape(h, [-1, 32]), w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return graph


def test_keras_layer_is_recognised_with_its_moving_statistics():
    layers = analyze_graph(_keras_graph()).batch_norms
    assert [(b.name, b.kind, b.moving) for b in layers] == [
        ("kbn", "moments", ["kbn/moving_mean", "kbn/moving_variance"])]


def test_inference_mode_and_weight_moments_are_not_batch_norm():
    assert analyze_graph(_keras_graph(training=False)).batch_norms == []
    # Only the Keras layer: the moments of w do not depend on the input batch.
    assert [b.name for b in analyze_graph(_keras_graph(weight_moments=True)).batch_norms] == ["kbn"]


def test_layer_normalisation_is_not_batch_norm():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 6], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        w = tf1.get_variable("w", [6, 3])
        mean, var = tf.nn.moments(x, [1], keepdims=True)      # per example
        h = tf.nn.batch_normalization(x, mean, var, None, None, 1e-3)
        # the fused layer-norm trick: examples as the channels of a batch of one
        flat = tf.reshape(h, [1, -1, 6, 1])
        ones = tf.ones([tf.shape(flat)[1]])
        h, _, _ = tf1.nn.fused_batch_norm(flat, ones, tf.zeros_like(ones), is_training=True,
                                          data_format="NCHW")
        logits = tf.matmul(tf.reshape(h, [-1, 6]), w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert analyze_graph(graph).batch_norms == []


def test_both_forms_in_the_test_cnn():
    layers = analyze_graph(models.build("bncnn_momentum").graph).batch_norms
    assert [(b.name, b.kind, len(b.grad_ops)) for b in layers] == [
        ("bn1", "moments", 0), ("bn2", "fused", 1)]
    assert layers[1].moving == ["bn2/moving_mean", "bn2/moving_variance"]


@pytest.mark.parametrize("option,workers,size", [("all", 3, 3), (2, 4, 2), (1, 4, 0), (None, 4, 0),
                                                 ("auto", 3, 3)])
def test_group_sizes(option, workers, size):
    analysis = analyze_graph(models.build("bncnn_momentum").graph)
    plan = make_plan(analysis, workers, options=PlanOptions(batch_norm_group=option))
    assert plan.batch_norm_group == size


def test_invalid_groups_raise():
    analysis = analyze_graph(models.build("bncnn_momentum").graph)
    with pytest.raises(AutoparError, match="does not split the job's 3 workers"):
        make_plan(analysis, 3, options=PlanOptions(batch_norm_group=2))
    for bad in ("some", 0, True, 1.5):
        with pytest.raises(AutoparError, match="batch_norm_group"):
            Config(batch_norm_group=bad)


def _collective_groups(graph_def) -> set[tuple[int, int]]:
    """(group size, group key) of the batch-norm collectives in a worker
    graph: inside the functions of the conds that run them in training steps
    alone (their constants made there too)."""
    found = set()
    for f in graph_def.library.function:
        if not f.signature.name.startswith("autopar_batch_norm_"):
            continue
        consts = {n.name: n.attr["value"].tensor.int_val[0] for n in f.node_def
                  if n.op == "Const" and n.attr["value"].tensor.int_val}
        found |= {(consts[n.input[1].split(":")[0]], consts[n.input[2].split(":")[0]])
                  for n in f.node_def if n.op == "CollectiveReduceV2"}
    assert not [n.name for n in graph_def.node if n.op == "CollectiveReduceV2"
                and n.name.startswith("autopar/batch_norm/")]
    return found


def test_rewrite_reads_group_statistics_forward_and_backward():
    m = models.build("bncnn_momentum")
    analysis = analyze_graph(m.graph)
    plan = make_plan(analysis, 4, options=PlanOptions(run_option="allreduce", batch_norm_group=2))
    graph_def = rewrite_for_worker(m.graph, analysis, plan, 3).meta_graph.graph_def
    nodes = {n.name: n for n in graph_def.node}
    # Consumers of the local moments, forward and backward, read the group's.
    readers = [n for n in graph_def.node if not n.name.startswith("autopar/")
               and any(i in ("moments/mean", "moments/variance") for i in n.input)]
    assert readers == []
    # The Mean gradients take the all-reduced upstream gradient.
    mean_grad = [n for n in graph_def.node if n.name.startswith("gradients/moments/mean_grad/")]
    assert any(i.startswith("autopar/batch_norm/") for n in mean_grad for i in n.input)
    # The fused layer's outputs and its gradient op's are read from the
    # replacement (only the gradient op reads the reserve outputs 3-5).
    fused = [n.name for n in graph_def.node if n.op == "FusedBatchNormV3"][0]
    grad = [n.name for n in graph_def.node if n.op == "FusedBatchNormGradV3"][0]
    replaced = {f"{op}{suffix}" for op in (fused, grad) for suffix in ("", ":1", ":2")}
    assert not [n.name for n in graph_def.node if not n.name.startswith("autopar/")
                and any(i in replaced for i in n.input)]
    readers = [c.name for c in m.graph.get_operation_by_name(fused).outputs[0].consumers()]
    assert readers and all(any(i.startswith("autopar/batch_norm/") for i in nodes[r].input)
                           for r in readers)
    # Worker 3 of 4 in groups of 2: the second group.
    assert _collective_groups(graph_def) == {(2, BATCH_NORM_GROUPS.first + 1)}
    whole = make_plan(analysis, 4, options=PlanOptions(run_option="allreduce", batch_norm_group="all"))
    assert _collective_groups(rewrite_for_worker(m.graph, analysis, whole, 3)
                              .meta_graph.graph_def) == {(4, GROUP_KEY)}


def test_report_lists_layers_and_their_moving_statistics():
    analysis = analyze_graph(models.build("bncnn_momentum").graph)
    on = build_report(analysis, make_plan(analysis, 3, options=PlanOptions(batch_norm_group="all")))
    text = on.table()
    assert "batch norm bn2 (fused): statistics over all 3 workers" in text
    assert ("state bn1/moving_variance (local): batch-norm moving statistic from the statistics "
            "of all workers") in text
    assert build_report(analysis, make_plan(analysis, 3)).table() == text   # the default
    off = build_report(analysis, make_plan(analysis, 3, options=PlanOptions(
        batch_norm_group=None))).table()
    assert "batch norm bn1 (moments): statistics of each worker's own batch" in off
    assert "state bn1/moving_mean (local): per worker (from the local batch)" in off


def test_report_notes_a_group_without_batch_norm_layers():
    analysis = analyze_graph(models.build("mlp_sgd").graph)
    text = build_report(analysis, make_plan(analysis, 3, options=PlanOptions(
        batch_norm_group="all"))).table()
    assert "Config(batch_norm_group) is set but the graph has no training-mode batch-norm" in text
    # "auto" (autopar.fit's default): nothing to synchronise, nothing to say
    plan = make_plan(analysis, 3, options=PlanOptions(batch_norm_group="auto"))
    assert plan.batch_norm_group == 0
    assert "batch_norm_group" not in build_report(analysis, plan).table()


def test_group_statistics_refuse_a_compute_threshold():
    """Statistics all-reduced in the forward pass need every worker to compute
    as many micro-batches as the others; a threshold lets them differ."""
    with pytest.raises(AutoparError, match="cannot be combined with Config.compute_threshold"):
        Config(batch_norm_group="all", micro_batches=4, compute_threshold=0.5)
    assert Config(batch_norm_group="all", micro_batches=4).micro_batches == 4


def test_group_statistics_refuse_micro_batches():
    """A micro-batch's run is no training step (the workers' group statistics
    are taken in steps only): with micro_batches > 1 a graph with batch norm
    is refused, naming the layer, unless its statistics are each worker's."""
    from autopar.transforms.compile import compile_for_config
    graph = models.build("bncnn_momentum").graph
    with pytest.raises(UnsupportedGraphError, match=r"batch norm 'bn1': with Config\(micro_"):
        compile_for_config(graph, 2, Config(micro_batches=2))
    assert compile_for_config(graph, 2, Config(micro_batches=2, batch_norm_group=None)) \
        .plan.batch_norm_group == 0


def _keras_step_rewrite(batch):
    """Worker 1 of 2's rewrite of a Keras 3 tf.function step with a
    BatchNormalization (tests/programs/keras_step.py "bn_mlp"), traced with
    a batch dimension of `batch` (None: dynamic)."""
    from autopar.transforms.lift import lift
    from tests.programs import keras_step
    with keras_step.keras_settings_kept():
        program = keras_step.build("bn_mlp", "adam", "float64")
        concrete = program.train_step.get_concrete_function(
            tf.TensorSpec([batch, keras_step.IDS], tf.int32), tf.TensorSpec([batch, 1], tf.float64))
        graph = lift(concrete).graph
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, 2, options=PlanOptions(run_option="allreduce", batch_norm_group="all"))
    return rewrite_for_worker(graph, analysis, plan, 1).meta_graph.graph_def


def test_a_gradient_tape_backward_pass_takes_the_group_gradient():
    """GradientTape names the Mean gradients after the forward op's scope
    (gradient_tape/<layer>/moments/...), not <op>_grad: found from data flow
    (the Mean's reduction axes count the averaged elements), the upstream
    gradient each broadcasts is the all-reduced one, scaled."""
    graph_def = _keras_step_rewrite(None)
    spreads = [n for n in graph_def.node if n.op == "BroadcastTo"
               and n.name.startswith("gradient_tape/")
               # (Keras numbers the layer's name by the models built before in this process)
               and re.search(r"/batch_normalization(_\d+)*/moments/", n.name)]
    assert len(spreads) == 2, [n.name for n in spreads]
    assert all(n.input[0].startswith("autopar/batch_norm/") for n in spreads), \
        [(n.name, n.input[0]) for n in spreads]


def test_a_tape_backward_pass_with_static_shapes_is_refused():
    """A GradientTape in a graph whose shapes are all static: the Mean
    gradients take constant counts and multiples, reading nothing of their
    Mean, and the tape's names do not say which Mean each belongs to.
    Refused, naming the statistics, rather than differentiated as if they
    were local."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [6, 4], name="x")
        y = tf1.placeholder(tf.float32, [6, 1], name="y")
        w = tf1.get_variable("w", [4, 4], use_resource=True)
        v = tf1.get_variable("v", [4, 1], use_resource=True)
        with tf.GradientTape() as tape:
            h = tf.matmul(x, w)
            mean, var = tf.nn.moments(h, [0], keepdims=True)
            h = (h - mean) * tf.math.rsqrt(var + 1e-3)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, v) - y))
        grads = tape.gradient(loss, [w, v])
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients(zip(grads, [w, v]))
    analysis = analyze_graph(graph)
    assert [b.kind for b in analysis.batch_norms] == ["moments"]
    plan = make_plan(analysis, 2, options=PlanOptions(run_option="allreduce", batch_norm_group="all"))
    with pytest.raises(AutoparError, match=r"batch-norm statistics .*moments/mean.*gradient "
                                           r"ops were not found"):
        rewrite_for_worker(graph, analysis, plan, 1)


def test_each_backward_pass_takes_its_own_group_gradient():
    """tests/programs/gan.py: the discriminator's second call is
    differentiated by the discriminator's backward pass (tf.gradients'
    "gradients/") and the generator's ("gradients_1/"). Each pass's
    gradients of its statistics are all-reduced on their own, so the
    generator's train op, run alone, runs no op of the other pass."""
    from tests.programs import gan
    program = gan.build("float64")
    analysis = analyze_graph(program.graph)
    plan = make_plan(analysis, 3, options=PlanOptions(run_option="allreduce",
                                                      batch_norm_group="all"))
    graph_def = rewrite_for_worker(program.graph, analysis, plan, 1).meta_graph.graph_def
    train_g = program.fetches["g"].name
    needed = tf1.graph_util.extract_sub_graph(graph_def, [train_g]).node
    names = {n.name for n in needed}
    assert not {n for n in names if n.startswith("gradients/")}
    # ...and reads the group's gradient of both layers of the second call
    reduced = {i for n in needed if n.name.startswith("gradients_1/discriminator_1/")
               for i in n.input if i.startswith("autopar/batch_norm/")}
    assert reduced, "the generator's pass reads no all-reduced statistics gradient"
    # (each collective the call of a cond that runs it in training steps only)
    collectives = [n.name for n in needed if n.op in ("If", "StatelessIf")
                   and n.name.startswith("autopar/batch_norm/")]
    # forward: 2 for each of the 3 layers (the generator's, the second
    # call's two); backward: the generator's layer (one pass: 1), the second
    # call's fused layer (one per pass: 1), its moments (one per upstream
    # gradient, mean and variance: 2)
    assert len(collectives) == 6 + 1 + 1 + 2, collectives


def _loss_on(graph_def, model, x, y) -> float:
    """The model's loss on (x, y) from `graph_def` run in a plain session of
    this process alone, its variables initialised."""
    feeds = {t.name: v for t, v in models.feed(model, x, y).items()}
    return float(run_locally(graph_def, lambda session: session.run(model.loss.name, feeds)))


def test_a_run_outside_a_training_step_normalises_by_its_own_batch():
    """A forward pass the chief runs alone (an evaluation, no other worker
    running it): a worker's graph with statistics over all 3 workers, run
    in a session of this process alone without the in-step flag, gives the
    loss one device gives on that batch, instead of waiting for the others.
    Its collectives are calls of functional conds even where tf.cond builds
    Switch and Merge (V1 control flow: a program that called
    disable_v2_behavior()), whose run on one worker would have moved that
    worker's collective step ids apart from the others'."""
    tf1.disable_control_flow_v2()
    try:
        m = models.build("bncnn_momentum")
        analysis = analyze_graph(m.graph)
        plan = make_plan(analysis, 3, options=PlanOptions(run_option="allreduce"))
        assert plan.batch_norm_group == 3   # the default, "auto"
        rewritten = rewrite_for_worker(m.graph, analysis, plan, 0)
    finally:
        tf1.enable_control_flow_v2()
    graph_def = rewritten.meta_graph.graph_def
    assert rewritten.in_step == "autopar/in_step:0"
    assert _collective_groups(graph_def) == {(3, GROUP_KEY)}
    assert not [n.name for n in graph_def.node if n.op in ("Switch", "Merge")
                and n.name.startswith("autopar/")]
    x, y = models.global_batch("bncnn_momentum", 0, 5)
    one_device = _loss_on(m.graph.as_graph_def(), m, x, y)
    assert np.isfinite(one_device)
    np.testing.assert_allclose(_loss_on(graph_def, m, x, y), one_device, rtol=1e-5)


@pytest.mark.parametrize("control_flow", ["v1", "v2"])
def test_moments_picked_through_a_cond_are_a_layer_with_its_moving_statistics(control_flow):
    """tf.compat.v1.layers.batch_normalization's form for a `training`
    tensor: the batch's moments taken outside any cond, then
    tf.cond(training, batch's, moving ones) before they normalise; the
    moving statistics updated under another cond. In V1 control flow
    (disable_v2_behavior()) the conds are Switch and Merge, the updates'
    writes take the variable through a Switch; in control flow v2 the pick
    is an If whose true branch returns its input (the update's If, which
    writes, is lowered: transforms.lower_cond). Found as a layer (before:
    its Mean a mixing of the batch), its moving statistics written by the
    step (before: by none, in V1 control flow)."""
    if control_flow == "v1":
        tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [None, 4], name="x")
            training = tf1.placeholder_with_default(False, [], name="training")
            moving = {n: tf1.get_variable(f"bn/moving_{n}", [4], initializer=init,
                                          trainable=False)
                      for n, init in (("mean", tf1.zeros_initializer()),
                                      ("variance", tf1.ones_initializer()))}
            mean, variance = tf.nn.moments(x, [0])
            mean = tf1.cond(training, lambda: mean, lambda: tf.identity(moving["mean"]))
            variance = tf1.cond(training, lambda: variance,
                                lambda: tf.identity(moving["variance"]))
            for name, value in (("mean", mean), ("variance", variance)):
                tf1.add_to_collection(tf1.GraphKeys.UPDATE_OPS, tf1.cond(
                    training, lambda v=moving[name], value=value: tf1.assign_sub(
                        v, (v - value) * 0.1).op, lambda: tf.no_op()))
            h = tf.nn.batch_normalization(x, mean, variance, None, None, 1e-3)
            loss = tf.reduce_mean(tf.square(tf.matmul(h, tf1.get_variable("w", [4, 1]))))
            with tf.control_dependencies(tf1.get_collection(tf1.GraphKeys.UPDATE_OPS)):
                tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        types = {op.type for op in graph.get_operations()}
        assert types >= ({"Switch", "Merge"} if control_flow == "v1" else {"If"})
        analysis = analyze_graph(lowered_graph(graph))
    finally:
        tf1.enable_control_flow_v2()
    assert [(b.kind, b.moving) for b in analysis.batch_norms] == [
        ("moments", ["bn/moving_mean", "bn/moving_variance"])]
    assert analysis.batch_mixing == {}
    state = {s.name: s for s in analysis.state}
    assert all(state[f"bn/moving_{n}"].update_ops for n in ("mean", "variance"))
