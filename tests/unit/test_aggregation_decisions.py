"""The analysis decisions that say how gradients and state combine across
workers, each on a small graph built here: deduplicated vs plain lookups,
how the loss reduces over the batch (and the Plan/Config decision that
follows), and state updated from the local batch (report and rewrite)."""
import warnings

import pytest
import tensorflow as tf

from autopar.config import Config
from autopar.common.errors import AutoparError, UnsupportedGraphError
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.compile import compile_for_config
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.report import build_report
from autopar.transforms.local_state import SYNC_LOCAL_STATE_OP
from autopar.transforms.rewrite import rewrite_for_worker

tf1 = tf.compat.v1
BATCH, IDS, VOCAB, DIM = 8, 3, 20, 4


def _graph(lookup="plain", loss="mean", batch=BATCH, state=None, clip=False):
    """ids[batch, 3] -> embedding[20, 4] -> mean over ids -> (state) -> w[4, 3] -> loss."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.int32, [batch, IDS], name="x")
        y = tf1.placeholder(tf.int32, [batch], name="y")
        emb = tf1.get_variable("embedding", [VOCAB, DIM])
        if lookup == "plain":
            h = tf.reduce_mean(tf.nn.embedding_lookup(emb, x), 1)
        elif lookup == "sparse":
            ids = tf.SparseTensor(tf.where(tf.ones_like(x, dtype=tf.bool)), tf.reshape(x, [-1]),
                                  tf.shape(x, out_type=tf.int64))
            h = tf.nn.embedding_lookup_sparse(emb, ids, None, combiner="mean")
        else:   # tf.unique, then gather the distinct rows once
            distinct, position = tf.unique(tf.reshape(x, [-1]))
            rows = tf.gather(tf.gather(emb, distinct), position)
            h = tf.reduce_mean(tf.reshape(rows, [-1, IDS, DIM]), 1)
        updates = []
        if state == "batch_norm":
            mean, var = tf.nn.moments(h, [0])
            moving = tf1.get_variable("bn/moving_mean", [DIM], trainable=False,
                                      initializer=tf1.zeros_initializer())
            updates.append(moving.assign_sub((moving - mean) * 0.1))
            h = tf.nn.batch_normalization(h, mean, var, None, None, 1e-3)
        if state == "fused_batch_norm":
            # What tf.compat.v1.layers.batch_normalization builds (that API
            # needs Keras 2): the fused kernel's batch moments feed the moving
            # statistics through assign_sub((moving - batch) * (1 - momentum)).
            scale = tf1.get_variable("bn/gamma", [DIM], initializer=tf1.ones_initializer())
            offset = tf1.get_variable("bn/beta", [DIM], initializer=tf1.zeros_initializer())
            out, mean, var = tf1.nn.fused_batch_norm(tf.reshape(h, [-1, 1, 1, DIM]), scale, offset,
                                                     is_training=True)
            for stat, value in (("moving_mean", mean), ("moving_variance", var)):
                moving = tf1.get_variable(f"bn/{stat}", [DIM], trainable=False,
                                          initializer=tf1.zeros_initializer())
                updates.append(moving.assign_sub((moving - value) * 0.01))
            h = tf.reshape(out, [-1, DIM])
        w = tf1.get_variable("w", [DIM, 3])
        logits = tf.matmul(h, w)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        reduction = tf1.losses.Reduction
        value = {
            "mean": lambda: tf.reduce_mean(per_example),
            "sum": lambda: tf.reduce_sum(per_example),
            "sum/size": lambda: tf.reduce_sum(per_example) / tf.cast(tf.size(per_example), tf.float32),
            "sum/8": lambda: tf.reduce_sum(per_example) / 8.0,
            "sum/24": lambda: tf.reduce_sum(per_example) / 24.0,
            "sum(logits^2)/8": lambda: tf.reduce_sum(tf.square(logits)) / 8.0,
            "sqrt(sum)": lambda: tf.sqrt(tf.reduce_sum(per_example)),
            # the classes' means over the batch, squared errors, summed over
            # the classes: the batch is averaged first
            "sum(mean0)": lambda: tf.reduce_sum(tf.reduce_mean(
                tf.square(tf.nn.softmax(logits) - tf.one_hot(y, 3)), axis=0)),
            "sum(w*mean0)": lambda: tf.reduce_sum(tf.constant([1.0, 2.0, 3.0]) * tf.reduce_mean(
                tf.square(logits), axis=0)),
            "sum(sum0)": lambda: tf.reduce_sum(tf.reduce_sum(tf.square(logits), axis=0)),
            # the batch moved to axis 1 and averaged there, then the classes summed
            "sum(mean1(transposed))": lambda: tf.reduce_sum(tf.reduce_mean(
                tf.transpose(tf.square(logits)), axis=1)),
            # a sum written as the mean times the batch's size
            "mean*size": lambda: tf.reduce_mean(per_example) * tf.cast(tf.shape(per_example)[0],
                                                                       tf.float32),
            # either loss, as a flag fed with each run chooses
            "where(flag,mean,mean/2)": lambda: tf.where(
                tf1.placeholder_with_default(True, [], name="flag"),
                tf.reduce_mean(per_example), tf.reduce_mean(per_example) / 2.0),
            "l2_loss": lambda: tf.nn.l2_loss(logits),
            "mean+sum": lambda: tf.reduce_mean(per_example) + tf.reduce_sum(per_example),
            "checked(mean(stack(sum,sum)))": lambda: tf.debugging.check_numerics(tf.reduce_mean(
                tf.stack([tf.reduce_sum(per_example), tf.reduce_sum(per_example)])), "loss"),
            "l2_loss/8": lambda: tf.nn.l2_loss(logits) / 8.0,
            "sum+reg": lambda: tf.reduce_sum(per_example) + 1e-3 * tf.nn.l2_loss(w),
            # Python's sum() of per-output losses, as Keras's compiled loss adds them
            "0+sum+sum": lambda: sum([tf.reduce_sum(per_example), 0.5 * tf.reduce_sum(per_example)]),
            "mean+reg": lambda: tf.reduce_mean(per_example) + 1e-3 * tf.nn.l2_loss(w),
            "0.5*sum": lambda: 0.5 * tf.reduce_sum(per_example),
            "losses.SUM": lambda: tf1.losses.sparse_softmax_cross_entropy(
                y, logits, reduction=reduction.SUM),
            "losses.MEAN": lambda: tf1.losses.sparse_softmax_cross_entropy(
                y, logits, reduction=reduction.MEAN),
            "losses.SUM_BY_NONZERO_WEIGHTS": lambda: tf1.losses.sparse_softmax_cross_entropy(
                y, logits, reduction=reduction.SUM_BY_NONZERO_WEIGHTS),
            "losses.SUM_OVER_BATCH_SIZE": lambda: tf1.losses.sparse_softmax_cross_entropy(
                y, logits, reduction=reduction.SUM_OVER_BATCH_SIZE),
        }[loss]()
        gs = tf1.train.get_or_create_global_step()
        opt = tf1.train.GradientDescentOptimizer(0.1)
        with tf.control_dependencies(updates):
            if clip:
                grads, variables = zip(*opt.compute_gradients(value))
                grads, _ = tf.clip_by_global_norm(grads, 1.0)
                train = opt.apply_gradients(zip(grads, variables), global_step=gs)
            else:
                train = opt.minimize(value, global_step=gs)
        if state == "ema_of_loss":
            ema = tf1.train.ExponentialMovingAverage(0.9)
            with tf.control_dependencies([train]):
                ema.apply([value])
        if state == "ema_of_weights":
            ema = tf1.train.ExponentialMovingAverage(0.9)
            with tf.control_dependencies([train]):
                ema.apply([w])
        if state == "separate_gradients":
            # A statistic assigned from a second tf.gradients call: the
            # activations' gradient of this worker's batch, never averaged.
            stat = tf1.get_variable("grad_stat", [], trainable=False,
                                    initializer=tf1.zeros_initializer())
            stat.assign(tf.reduce_mean(tf.abs(tf.gradients(value, h)[0])))
    return graph


# ------------------------------------------------------------- dedup vs plain
@pytest.mark.parametrize("lookup,dedup", [("plain", False), ("sparse", True), ("unique", True)])
def test_sparse_gradient_kind(lookup, dedup):
    analysis = analyze_graph(_graph(lookup))
    assert [v.name for v in analysis.sparse] == ["embedding"]
    assert analysis.variable("embedding").dedup is dedup
    assert analysis.variable("w").dedup is False


def _partitioned_lookup(split: str) -> tf.Graph:
    """The batch's distinct ids looked up in a table of 2 partitions of 10
    rows, split by embedding_lookup's `split` strategy ("mod", "div"), or
    "colliding": partition id % 2, row id // 4, where ids 0 and 2 both
    land on row 0 of partition 0."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.int32, [BATCH, IDS], name="x")
        y = tf1.placeholder(tf.int32, [BATCH], name="y")
        parts = [tf1.get_variable(f"embedding/part_{k}", [VOCAB // 2, DIM]) for k in range(2)]
        distinct, position = tf.unique(tf.reshape(x, [-1]))
        if split == "colliding":
            part, row = distinct % 2, distinct // 4
            where = tf.dynamic_partition(tf.range(tf.size(distinct)), part, 2)
            pieces = tf.dynamic_partition(row, part, 2)
            rows = tf.dynamic_stitch(where, [tf.gather(parts[k], pieces[k]) for k in range(2)])
        else:
            rows = tf1.nn.embedding_lookup(parts, distinct, partition_strategy=split)
        h = tf.reduce_mean(tf.reshape(tf.gather(rows, position), [-1, IDS, DIM]), 1)
        logits = tf.matmul(h, tf1.get_variable("w", [DIM, 3]))
        tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)))
    return graph


@pytest.mark.parametrize("split,dedup", [("mod", True), ("div", True), ("colliding", False)])
def test_a_partitioned_tables_rows_of_distinct_ids_are_distinct_where_each_id_has_its_row(
        split, dedup):
    """Each partition's ids of a lookup of distinct ids are distinct when
    every id of the table has a row of its own (both of TensorFlow's
    strategies, checked by evaluating the split at every id), so rows of
    one id from several workers are combined by id (before: taken for ids
    no example owns, and refused under a global norm)."""
    analysis = analyze_graph(_partitioned_lookup(split))
    assert [analysis.variable(f"embedding/part_{k}").dedup for k in range(2)] == [dedup] * 2


def test_dedup_ps_norm_gets_a_row_gather():
    """With a global-norm consumer, a deduplicated PS variable's norm term needs
    every worker's rows (its own gather keys); a plain one a scalar all-reduce."""
    topology = Topology(("a", "a", "b"), 2)
    for lookup, gathers in (("sparse", True), ("plain", False)):
        plan = make_plan(analyze_graph(_graph(lookup, clip=True)), topology,
                         options=PlanOptions(run_option="hybrid"))
        keys = plan.variable("embedding").keys
        assert ("norm_count" in keys) is gathers
        assert "norm" in keys
        used = sorted(k for vp in plan.variables for k in vp.keys.values())
        assert len(used) == len(set(used))


def test_dedup_rows_are_combined_in_allgather_rewrite():
    """allreduce: the gathered rows of a deduplicated gradient go through
    unique + unsorted_segment_sum before the optimizer; a plain one's do not."""
    for lookup, combined in (("sparse", True), ("plain", False)):
        graph = _graph(lookup, clip=True)
        analysis = analyze_graph(graph)
        plan = make_plan(analysis, 2, options=PlanOptions(run_option="allreduce"))
        worker = rewrite_for_worker(graph, analysis, plan, 0)
        values = worker.replaced[analysis.variable("embedding").grad_values]
        nodes = {n.name: n for n in worker.meta_graph.graph_def.node}
        assert (nodes[values.split(":")[0]].op == "UnsortedSegmentSum") is combined


# ---------------------------------------------------------- loss reduction
@pytest.mark.parametrize("loss,batch,expected", [
    ("mean", BATCH, "mean"),
    ("sum", BATCH, "sum"),
    ("sum", None, "sum"),
    ("0.5*sum", BATCH, "sum"),
    ("sum/size", BATCH, "mean"),
    ("sum/size", None, "mean"),     # tf.size of a dynamic batch: a batch-derived tensor
    ("sum/8", BATCH, "mean"),       # the per-worker batch size of a static graph
    ("sum(logits^2)/8", BATCH, "mean"),   # its examples, not the elements summed
    # any other constant: a scaled sum (tf.nn.compute_average_loss with a
    # global_batch_size), which one device divides by the same constant
    ("sum/24", BATCH, "sum"),
    ("sum/8", None, "sum"),
    ("sqrt(sum)", BATCH, "unknown"),
    ("sum(mean0)", None, "mean"),
    ("sum(mean0)", BATCH, "mean"),
    ("sum(w*mean0)", None, "mean"),
    ("sum(sum0)", None, "sum"),
    ("sum(mean1(transposed))", None, "mean"),
    ("sum(mean1(transposed))", BATCH, "mean"),
    ("mean*size", None, "unknown"),
    ("where(flag,mean,mean/2)", None, "mean"),
    ("l2_loss", None, "sum"),       # half the sum of squares over the batch
    ("checked(mean(stack(sum,sum)))", None, "sum"),
    ("mean+sum", BATCH, "neither"),  # no aggregation matches one device
    ("l2_loss/8", BATCH, "mean"),
    ("mean+reg", BATCH, "mean"),
    ("sum+reg", BATCH, "neither"),  # a regularizer added N times if summed
    ("0+sum+sum", BATCH, "sum"),    # a constant term has no gradient
    ("losses.SUM", BATCH, "sum"),
    ("losses.SUM", None, "sum"),
    ("losses.MEAN", BATCH, "mean"),
    ("losses.MEAN", None, "mean"),
    ("losses.SUM_BY_NONZERO_WEIGHTS", BATCH, "mean"),
    ("losses.SUM_BY_NONZERO_WEIGHTS", None, "mean"),
    ("losses.SUM_OVER_BATCH_SIZE", BATCH, "mean"),
    ("losses.SUM_OVER_BATCH_SIZE", None, "mean"),
])
def test_loss_reduction(loss, batch, expected):
    analysis = analyze_graph(_graph(loss=loss, batch=batch))
    assert analysis.loss_reduction == expected, analysis.loss_reduction_why
    assert analysis.loss_reduction_why


@pytest.mark.parametrize("loss,option,decided", [
    ("sum", "auto", "sum"), ("mean", "auto", "mean"), ("sqrt(sum)", "auto", "mean"),
    ("sum/24", "sum", "sum"), ("mean", "sum", "sum"), ("sum", "mean", "mean"),
])
def test_plan_decision_and_report(loss, option, decided):
    analysis = analyze_graph(_graph(loss=loss))
    plan = make_plan(analysis, 4, options=PlanOptions(run_option="allreduce", loss_reduction=option))
    assert plan.loss_reduction == decided
    assert plan.gradient_scale("dense") == (0.25 if decided == "mean" else 1.0)
    table = build_report(analysis, plan).table()
    combine = "averaged" if decided == "mean" else "summed"
    assert f"gradients: {combine} over workers, dense and sparse (loss_reduction={decided}" in table
    if analysis.loss_reduction == "unknown" and option == "auto":
        assert "not determined from the graph" in table


@pytest.mark.parametrize("loss,final_op,scale", [("sum", "Id", 1.0), ("mean", "Div", 0.5)])
def test_rewrite_sums_or_averages_dense_and_sparse(loss, final_op, scale):
    graph = _graph(loss=loss)
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, 2, options=PlanOptions(run_option="allreduce"))
    nodes = rewrite_for_worker(graph, analysis, plan, 0).meta_graph.graph_def.node
    reduces = [n for n in nodes if n.op == "CollectiveReduceV2" and n.name.startswith("autopar/average")]
    assert reduces and {n.attr["final_op"].s.decode() for n in reduces} == {final_op}
    scales = [n for n in nodes if n.name.startswith("autopar/average") and n.op == "Const"
              and n.attr["dtype"].type == tf.float32.as_datatype_enum
              and tf.make_ndarray(n.attr["value"].tensor).shape == ()]
    assert [float(tf.make_ndarray(n.attr["value"].tensor)) for n in scales] == [scale]


def test_summed_loss_with_a_batch_independent_term_is_refused_unless_chosen():
    """Neither summing nor averaging gives one device's gradient: "auto"
    stops with the analysis's reason; an explicit choice trains, and the
    report says it cannot match one device."""
    analysis = analyze_graph(_graph(loss="sum+reg"))
    with pytest.raises(UnsupportedGraphError, match="adds a batch-independent term.*"
                                                    r"Config\(loss_reduction='sum'\)"):
        make_plan(analysis, 4, options=PlanOptions(run_option="allreduce"))
    plan = make_plan(analysis, 4, options=PlanOptions(run_option="allreduce",
                                                      loss_reduction="sum"))
    assert plan.loss_reduction == "sum"
    assert "no aggregation makes this graph's training equal one device's" in \
        build_report(analysis, plan).table()


def _summed_plus_term(term_scale: float) -> tuple:
    """A loss summed over the batch plus `term_scale` times an L2 term."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        x = tf1.placeholder(tf.float64, [None, 5], name="x")
        y = tf1.placeholder(tf.int32, [None], name="y")
        w = tf1.get_variable("w", [5, 3], tf.float64)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=x @ w)
        loss = tf.reduce_sum(per_example) + term_scale * 0.5 * tf.nn.l2_loss(w)
        train = tf1.train.AdamOptimizer(0.05).minimize(loss)
    return graph, train


@pytest.mark.slow
def test_the_refusals_way_to_one_device_for_a_summed_loss_with_a_term_trains_as_one_device():
    """What the refusal says gives one device's training: the term divided
    by the number of workers, the workers' gradients summed (Σ_w of each
    share's sum's gradient plus the term's / N is one device's). 3 workers
    with 4/4/3 shares against one device's program with the whole term."""
    import numpy as np
    from tests.unit.local_run import (each_worker_holds, trained_alone_and_together,
                                      variable_reads)
    one_device, train = _summed_plus_term(1.0)
    with pytest.raises(UnsupportedGraphError, match="summing them does, Config.*divides the "
                                                    r"term by autopar.num_workers\(\)"):
        compile_for_config(one_device, 3, Config(run_option="allreduce"))
    divided, _ = _summed_plus_term(1.0 / 3)
    compiled = compile_for_config(divided, 3, Config(run_option="allreduce",
                                                     loss_reduction="sum"))
    rewritten = [rewrite_for_worker(divided, compiled.analysis, compiled.plan, w)
                 for w in range(3)]
    rng = np.random.default_rng(0)
    batches = [(rng.normal(size=(11, 5)), rng.integers(0, 3, 11)) for _ in range(3)]
    got, expected = trained_alone_and_together(one_device, rewritten, train.name, batches,
                                               ("x:0", "y:0"), variable_reads(one_device))
    # float64; Adam's 1 / sqrt(v) of gradients summed in another order
    each_worker_holds(got, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("run_option", ["allreduce", "hybrid", "ps"])
def test_parallax_semantics_average_dense_and_sum_sparse(run_option):
    """loss_reduction="parallax" (Parallax's average_sparse=False): the dense
    gradient is averaged, the sparse one summed, on every path; the report
    says these are Parallax's semantics."""
    graph = _graph()
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, Topology(("127.0.0.1",) * 2, 1),
                     options=PlanOptions(run_option=run_option, loss_reduction="parallax"))
    assert (plan.gradient_scale("dense"), plan.gradient_scale("sparse")) == (0.5, 1.0)
    assert plan.averages("dense") and not plan.averages("sparse")
    table = build_report(analysis, plan).table()
    assert "gradients: dense averaged and sparse summed over workers" in table
    assert "Parallax's semantics, not one device's" in table
    nodes = rewrite_for_worker(graph, analysis, plan, 0).meta_graph.graph_def.node
    if run_option != "ps":   # the dense bucket's mean; the sparse rows' scale 1
        reduces = [n for n in nodes if n.op == "CollectiveReduceV2"
                   and n.name.startswith("autopar/average")]
        assert {n.attr["final_op"].s.decode() for n in reduces} == {"Div"}
    scales = sorted(float(tf.make_ndarray(n.attr["value"].tensor)) for n in nodes
                    if n.op == "Const" and n.name.startswith("autopar/")
                    and n.attr["dtype"].type == tf.float32.as_datatype_enum
                    and tf.make_ndarray(n.attr["value"].tensor).shape == ()
                    and float(tf.make_ndarray(n.attr["value"].tensor)) in (0.5, 1.0))
    assert 1.0 in scales and (run_option != "ps" or 0.5 in scales)   # ps: the dense push x 1/2


def test_config_loss_reduction_and_deprecated_average_sparse():
    assert Config().loss_reduction == "auto"
    with pytest.raises(AutoparError, match="loss_reduction"):
        Config(loss_reduction="median")
    with pytest.raises(AutoparError, match="sync_local_state"):
        Config(sync_local_state="sum")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Config(average_sparse=False).loss_reduction == "parallax"
        assert Config(average_sparse=True).loss_reduction == "mean"
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert Config(loss_reduction="sum").loss_reduction == "sum"


# ------------------------------------------------------- batch-local state
@pytest.mark.parametrize("state,name,kind", [
    ("batch_norm", "bn/moving_mean", "local"),
    ("fused_batch_norm", "bn/moving_variance", "local"),
    ("ema_of_loss", None, "local"),                # a moving average of this worker's loss
    ("separate_gradients", "grad_stat", "local"),
    ("ema_of_weights", "w/ExponentialMovingAverage", "ema"),
])
def test_state_kind(state, name, kind):
    analysis = analyze_graph(_graph(state=state))
    kinds = {s.name: s.kind for s in analysis.state}
    if name is None:
        [name] = [n for n in kinds if n.endswith("/ExponentialMovingAverage")]
    assert kinds[name] == kind
    assert kinds["global_step"] == "global_step"
    others = {n for n in kinds if n != name and not (state == "fused_batch_norm"
                                                      and n.startswith("bn/moving_"))}
    assert all(kinds[n] != "local" for n in others)


@pytest.mark.parametrize("sync", ["none", "average"])
def test_local_state_report_and_sync_op(sync):
    graph = _graph(state="batch_norm")
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, 2, options=PlanOptions(run_option="allreduce", sync_local_state=sync,
                                                      batch_norm_group=None))
    table = build_report(analysis, plan).table()
    line = [ln for ln in table.splitlines() if ln.startswith("state bn/moving_mean (local)")]
    assert line and "per worker (from the local batch)" in line[0]
    assert ("averaged over workers after every step" in line[0]) is (sync == "average")
    assert "replicated" not in line[0]
    worker = rewrite_for_worker(graph, analysis, plan, 1)
    nodes = {n.name: n for n in worker.meta_graph.graph_def.node}
    if sync == "none":
        assert worker.after_step is None and SYNC_LOCAL_STATE_OP not in nodes
        return
    assert worker.after_step == SYNC_LOCAL_STATE_OP
    # One mean all-reduce over the local state, assigned back to it.
    reduces = [n for n in nodes.values() if n.name.startswith("autopar/sync_local")
               and n.op == "CollectiveReduceV2"]
    assert len(reduces) == 1 and reduces[0].attr["final_op"].s == b"Div"
    assigns = [n for n in nodes.values() if n.name.startswith("autopar/sync_local")
               and n.op in ("AssignVariableOp", "Assign")]
    assert [n.input[0] for n in assigns] == ["bn/moving_mean"]


def test_a_loss_whose_reduction_the_graph_does_not_show_is_refused_unless_chosen():
    """A sum written as the mean times the batch's size: averaging the
    workers' gradients would divide one device's by N. autopar does not
    guess (before: it averaged, "assuming a mean"): the job is refused
    before it starts, naming the op, until Config says how the gradients
    combine; one worker alone is one device."""
    graph = _graph(loss="mean*size", batch=None)
    with pytest.raises(UnsupportedGraphError) as refused:
        compile_for_config(graph, 4, Config())
    assert str(refused.value).startswith(
        "cannot tell how the loss reduces over the batch ('mul' multiplies two "
        "batch-dependent tensors), so not how the workers' gradients combine")
    assert "Config(loss_reduction='mean')" in str(refused.value)
    assert compile_for_config(graph, 4, Config(loss_reduction="sum")).plan \
        .loss_reduction == "sum"
    compile_for_config(graph, 1, Config())


def test_state_no_step_writes_is_reported_as_such():
    """A learning rate the program sets between steps (and a batch norm's
    moving statistics where the step runs it in inference mode) is state
    the step only reads: the report says no step writes it, where the
    global step is written by every worker's step."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 1])
        rate = tf1.get_variable("rate", [], initializer=tf1.constant_initializer(0.1),
                                trainable=False)
        step = tf1.train.get_or_create_global_step()
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        tf1.train.GradientDescentOptimizer(rate).minimize(loss, global_step=step)
    analysis = analyze_graph(graph)
    table = build_report(analysis, make_plan(analysis, 2)).table()
    lines = {ln.split(":", 1)[0]: ln.split(":", 1)[1] for ln in table.splitlines()
             if ln.startswith("state ")}
    assert "written by no training step" in lines["state rate (other)"]
    assert "updated once per step on every worker" in lines["state global_step (global_step)"]


@pytest.mark.parametrize("kind", ["memory_bank", "running_mean", "moving_statistics"])
def test_a_loss_reading_state_each_worker_writes_from_its_batch_is_refused(kind):
    """A memory bank of the batch's embeddings, a running mean the inputs
    are normalised by: each worker's loss would read its own share's values
    (3 workers: parameters off by up to 0.15 after 4 steps, before). Batch
    norm's moving statistics, which the training loss does not read, are
    per-worker state that trains as one device."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 3], name="x")
        w = tf1.get_variable("w", [3, 2])
        state = tf1.get_variable("state", [3], initializer=tf1.zeros_initializer(),
                                 trainable=False)
        update = tf1.assign(state, 0.9 * state + 0.1 * tf.reduce_mean(x, 0))
        if kind == "memory_bank":
            loss = tf.reduce_mean(tf.square(tf.matmul(x * state, w)))
        elif kind == "running_mean":
            with tf.control_dependencies([update]):
                loss = tf.reduce_mean(tf.square(tf.matmul(x - state, w)))
        else:   # written from the batch, read by no loss
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        tf.group(train, update, name="step")
    analysis = analyze_graph(graph)
    [local] = [s for s in analysis.state if s.kind == "local"]
    assert local.read_by_loss is (kind != "moving_statistics")
    if kind == "moving_statistics":
        compile_for_config(graph, 3, Config())
        return
    with pytest.raises(UnsupportedGraphError,
                       match="the loss reads 'state', state each worker writes from its own batch"):
        compile_for_config(graph, 3, Config())
    compile_for_config(graph, 3, Config(sync_local_state="average"))
    compile_for_config(graph, 1, Config())
