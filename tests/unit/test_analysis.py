"""transforms.analysis on many training-graph shapes.

Every expected value comes from the graph the test built: variable names and
shapes from the builder, byte sizes by arithmetic (elements x dtype size), the
gradient tensors from what compute_gradients returned (or, for minimize(), the
gradient input of the optimizer's apply op)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from tests.models import (CASE_BATCH, CASE_IDS_PER_EXAMPLE, CASE_VOCAB, SLOT_SUFFIXES,
                          build_case)
from autopar.transforms.analysis import analyze_graph

tf1 = tf.compat.v1
REPO = Path(__file__).resolve().parents[2]

# name -> (shape, bytes), bytes = elements x 4 (float32) or x 8 (float64).
MLP_VARS = {
    "l1/kernel": ((6, 4), 6 * 4 * 4), "l1/bias": ((4,), 4 * 4),
    "l2/kernel": ((4, 4), 4 * 4 * 4), "l2/bias": ((4,), 4 * 4),
    "l3/kernel": ((4, 4), 4 * 4 * 4), "l3/bias": ((4,), 4 * 4),
    "out/kernel": ((4, 3), 4 * 3 * 4), "out/bias": ((3,), 3 * 4),
}
EMB_VARS = {
    "embedding": ((50, 5), 50 * 5 * 4),
    "head/kernel": ((5, 3), 5 * 3 * 4), "head/bias": ((3,), 3 * 4),
}
F64_VARS = {
    "l1/kernel": ((6, 4), 6 * 4 * 4), "l1/bias": ((4,), 4 * 4),
    "wide/kernel": ((4, 4), 4 * 4 * 8), "wide/bias": ((4,), 4 * 8),
    "out/kernel": ((4, 3), 4 * 3 * 4), "out/bias": ((3,), 3 * 4),
}
# 8 examples x 3 ids each = 24 gathered rows of a 50-row table.
EMB_ALPHA = 24 / 50


# ----------------------------------------------------------------- helpers
def in_gradients_scope(name: str) -> bool:
    return any(p == "gradients" or (p.startswith("gradients_") and p[10:].isdigit())
               for p in name.split("/")[:-1])


def op_input(op: tf.Operation, arg: str) -> tf.Tensor:
    names = [a.name for a in op.op_def.input_arg]
    return op.inputs[names.index(arg)]


def apply_op_of(graph, info) -> tf.Operation:
    """The optimizer kernel (Apply*/ResourceApply*) among the variable's update ops."""
    kernels = [graph.get_operation_by_name(u) for u in info.update_ops]
    kernels = [op for op in kernels if "Apply" in op.type]
    assert len(kernels) == 1, [op.type for op in kernels]
    return kernels[0]


def check_variables(analysis, case, expected: dict, optimizer: str, dtype_of=None):
    """Name, order, shape, dtype, bytes, update ops and slots of every variable."""
    assert [v.name for v in analysis.variables] == list(case.variables)
    assert [v.name for v in analysis.variables] == list(expected)
    for info in analysis.variables:
        shape, nbytes = expected[info.name]
        assert info.shape == shape
        assert info.bytes == nbytes
        want_dtype = (dtype_of or {}).get(info.name, "float32")
        assert info.dtype == want_dtype
        assert info.update_ops, info.name
        for u in info.update_ops:
            assert f"/update_{info.name}/" in "/" + u, (info.name, u)
        assert info.slots == sorted(f"{info.name}/{s}" for s in SLOT_SUFFIXES[optimizer])


def check_dense_gradient(graph, info, expected_grad_name=None, optimizer="sgd"):
    assert info.gradient == "dense"
    assert info.grad_values is None and info.grad_indices is None
    grad = graph.get_tensor_by_name(info.grad_tensor)
    assert in_gradients_scope(grad.op.name)
    assert tuple(grad.shape.as_list()) == info.shape
    if expected_grad_name is not None:
        assert info.grad_tensor == expected_grad_name
    else:
        # minimize(): the optimizer kernel reads the gradient directly.
        kernel = apply_op_of(graph, info)
        arg = "delta" if optimizer == "sgd" else "grad"
        assert op_input(kernel, arg).name == info.grad_tensor


def check_state(analysis, case, optimizer):
    expected = {}
    if case.global_step is not None:
        expected[case.global_step.op.name] = "global_step"
    if optimizer == "adam":
        expected["beta1_power"] = "optimizer"
        expected["beta2_power"] = "optimizer"
    for shadow in case.ema_shadows or []:
        expected[shadow] = "ema"
    assert {s.name: s.kind for s in analysis.state} == expected
    for s in analysis.state:
        assert s.update_ops, s.name
    if case.global_step is not None:
        gs = next(s for s in analysis.state if s.kind == "global_step")
        # apply_gradients(global_step=...) returns the op that increments it.
        assert gs.update_ops == [case.apply_op.name]
    if optimizer == "adam":
        for s in analysis.state:
            if s.kind == "optimizer":
                assert all(u.startswith("Adam/") for u in s.update_ops), s.update_ops
    for s in analysis.state:
        if s.kind == "ema":
            assert all(u.startswith("ExponentialMovingAverage/") for u in s.update_ops)


def check_step_ops(analysis, case):
    assert case.train_op.name in analysis.step_ops
    assert case.apply_op.name in analysis.step_ops
    assert case.loss.op.name not in analysis.step_ops
    for info in analysis.variables:
        for u in info.update_ops:
            if "Apply" in case.graph.get_operation_by_name(u).type:
                assert u in analysis.step_ops
        for g in (info.grad_tensor, info.grad_values, info.grad_indices):
            if g:
                assert g.split(":")[0] not in analysis.step_ops
    assert not any(in_gradients_scope(n) for n in analysis.step_ops)
    forward = [op.name for op in case.graph.get_operations() if op.type == "MatMul"
               and not in_gradients_scope(op.name)]
    assert forward and not set(forward) & analysis.step_ops


# ----------------------------------------------------- one optimizer at a time
@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam", "adagrad", "rmsprop"])
def test_minimize_with_each_optimizer(optimizer, use_resource):
    case = build_case("mlp", optimizer, minimize=True, use_resource=use_resource)
    a = analyze_graph(case.graph)
    check_variables(a, case, MLP_VARS, optimizer)
    for info in a.variables:
        check_dense_gradient(case.graph, info, optimizer=optimizer)
        assert info.path_ops == []          # gradient feeds the update directly
        assert info.boundary_ops == []      # only MatMul/Add read the variables
        assert info.alpha is None
    # the nearest-gradient rule: 8 variables, 8 different gradient tensors
    assert len({v.grad_tensor for v in a.variables}) == len(MLP_VARS)
    check_state(a, case, optimizer)
    check_step_ops(a, case)
    assert a.loss == case.loss.name == "loss:0"
    assert a.untrained == []
    assert [v.name for v in a.dense] == list(MLP_VARS) and a.sparse == []


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam", "lars"])
def test_compute_apply_gradients_names_the_returned_gradients(optimizer, use_resource):
    case = build_case("mlp", optimizer, use_resource=use_resource)
    a = analyze_graph(case.graph)
    check_variables(a, case, MLP_VARS, optimizer)
    for info in a.variables:
        check_dense_gradient(case.graph, info, case.grads[info.name].name)
    check_state(a, case, optimizer)
    check_step_ops(a, case)


# ----------------------------------------------------------------- clipping
@pytest.mark.slow
@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("optimizer", ["momentum", "adam", "lars"])
def test_clip_by_global_norm_each_variable_gets_its_own_gradient(optimizer, use_resource):
    case = build_case("mlp", optimizer, clip=True, use_resource=use_resource)
    a = analyze_graph(case.graph)
    check_variables(a, case, MLP_VARS, optimizer)
    # l2/kernel and l3/kernel are both 4x4, the three biases all have 4 elements:
    # only the nearest-gradient rule tells them apart.
    assert MLP_VARS["l2/kernel"][0] == MLP_VARS["l3/kernel"][0]
    for info in a.variables:
        check_dense_gradient(case.graph, info, case.grads[info.name].name)
        own_clipped = case.applied[info.name].op.name
        assert own_clipped in info.path_ops
        assert case.global_norm.op.name in info.path_ops
        assert any(p.startswith("global_norm/") for p in info.path_ops)
        others = {case.applied[n].op.name for n in case.variables if n != info.name}
        assert not others & set(info.path_ops), info.name
        assert not any(in_gradients_scope(p) for p in info.path_ops)
        assert not set(info.update_ops) & set(info.path_ops)
    check_state(a, case, optimizer)
    check_step_ops(a, case)
    assert a.loss == "loss:0"


# ---------------------------------------------------------------- embeddings
@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
@pytest.mark.parametrize("optimizer,clip", [("sgd", False), ("adagrad", False), ("adam", False),
                                            ("momentum", False), ("adagrad", True),
                                            ("adam", True)])
def test_embedding_lookup_gives_a_sparse_gradient(optimizer, clip, use_resource):
    case = build_case("emb", optimizer, clip=clip, use_resource=use_resource)
    a = analyze_graph(case.graph)
    check_variables(a, case, EMB_VARS, optimizer)
    emb = a.variable("embedding")
    slices = case.grads["embedding"]
    assert isinstance(slices, tf.IndexedSlices)
    assert emb.gradient == "sparse"
    assert emb.grad_tensor is None
    assert emb.grad_values == slices.values.name
    assert emb.grad_indices == slices.indices.name
    assert emb.alpha == pytest.approx(CASE_BATCH * CASE_IDS_PER_EXAMPLE / CASE_VOCAB)
    assert emb.alpha == pytest.approx(EMB_ALPHA)
    gathers = [op.name for op in case.graph.get_operations()
               if op.type in ("ResourceGather", "GatherV2", "Gather")
               and not in_gradients_scope(op.name)]
    assert len(gathers) == 1
    assert gathers[0] in emb.boundary_ops
    assert [v.name for v in a.sparse] == ["embedding"]
    assert [v.name for v in a.dense] == ["head/kernel", "head/bias"]
    for name in ("head/kernel", "head/bias"):
        info = a.variable(name)
        check_dense_gradient(case.graph, info, case.grads[name].name)
        assert info.boundary_ops == []
        assert info.alpha is None
    if clip:
        assert case.applied["embedding"].values.op.name in emb.path_ops
        assert case.global_norm.op.name in emb.path_ops
        assert case.applied["head/kernel"].op.name not in emb.path_ops
    else:
        assert emb.path_ops == []
    check_state(a, case, optimizer)
    check_step_ops(a, case)


def test_embedding_with_dynamic_batch_has_unknown_alpha():
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [None, 3], name="ids")
        emb = tf1.get_variable("emb", [30, 4])
        loss = tf.reduce_mean(tf.nn.embedding_lookup(emb, ids), name="loss")
        tf1.train.AdagradOptimizer(0.1).minimize(loss)
    a = analyze_graph(graph)
    info = a.variable("emb")
    assert info.gradient == "sparse" and info.alpha is None
    assert info.bytes == 30 * 4 * 4


# ---------------------------------------------------- moving averages, dtypes
@pytest.mark.slow
@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_exponential_moving_average_and_global_step(use_resource):
    case = build_case("mlp", "momentum", clip=True, ema=True, use_resource=use_resource)
    a = analyze_graph(case.graph)
    check_variables(a, case, MLP_VARS, "momentum")
    assert len(case.ema_shadows) == len(MLP_VARS)
    assert case.ema_shadows == [f"{n}/ExponentialMovingAverage" for n in MLP_VARS]
    check_state(a, case, "momentum")
    # shadows are state, never trained variables
    assert not {v.name for v in a.variables} & set(case.ema_shadows)
    # the EMA op runs after the optimizer: both mean "one step"
    assert case.train_op.name != case.apply_op.name
    check_step_ops(a, case)
    for s in a.state:
        if s.kind == "ema":
            for u in s.update_ops:
                assert u in a.step_ops


@pytest.mark.slow
def test_float64_variables_have_their_own_dtype_and_size():
    case = build_case("f64", "adam")
    a = analyze_graph(case.graph)
    check_variables(a, case, F64_VARS, "adam",
                    dtype_of={"wide/kernel": "float64", "wide/bias": "float64"})
    for info in a.variables:
        check_dense_gradient(case.graph, info, case.grads[info.name].name)
        assert case.graph.get_tensor_by_name(info.grad_tensor).dtype.name == info.dtype


def test_no_global_step_no_state():
    case = build_case("mlp", "sgd", minimize=True, global_step=False)
    a = analyze_graph(case.graph)
    assert a.state == []
    check_step_ops(a, case)


# ------------------------------------------------------- names and var lists
@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_variable_name_prefix_of_another(use_resource):
    """Variables "a" and "a/b" (and "ab"): update_a/... belongs to "a",
    update_a/b/... to "a/b"."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 5], name="x")
        a = tf1.get_variable("a", [5, 4], use_resource=use_resource)
        with tf1.variable_scope("a"):
            ab = tf1.get_variable("b", [4, 3], use_resource=use_resource)
        ab2 = tf1.get_variable("ab", [3, 2], use_resource=use_resource)
        loss = tf.reduce_mean(tf.matmul(tf.matmul(tf.matmul(x, a), ab), ab2), name="loss")
        opt = tf1.train.MomentumOptimizer(0.1, 0.9)
        pairs = opt.compute_gradients(loss)
        opt.apply_gradients(pairs)
    grads = {v.op.name: g.name for g, v in pairs}
    an = analyze_graph(graph)
    assert [v.name for v in an.variables] == ["a", "a/b", "ab"]
    expected = {"a": ((5, 4), 80), "a/b": ((4, 3), 48), "ab": ((3, 2), 24)}
    for info in an.variables:
        assert (info.shape, info.bytes) == expected[info.name]
        assert info.grad_tensor == grads[info.name]
        assert info.slots == [f"{info.name}/Momentum"]
        assert info.update_ops
        for u in info.update_ops:
            assert f"/update_{info.name}/" in "/" + u
    for u in an.variable("a").update_ops:
        assert "/update_a/b/" not in "/" + u
    all_updates = [u for v in an.variables for u in v.update_ops]
    assert len(all_updates) == len(set(all_updates))
    all_slots = {s for v in an.variables for s in v.slots}
    assert all_slots == {"a/Momentum", "a/b/Momentum", "ab/Momentum"}


@pytest.mark.parametrize("use_resource", [True, False], ids=["resource", "ref"])
def test_trainable_variable_outside_var_list_is_untrained(use_resource):
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        frozen = tf1.get_variable("frozen", [4, 4], use_resource=use_resource)
        w = tf1.get_variable("w", [4, 3], use_resource=use_resource)
        loss = tf.reduce_mean(tf.matmul(tf.matmul(x, frozen), w), name="loss")
        opt = tf1.train.AdamOptimizer(0.1)
        pairs = opt.compute_gradients(loss, var_list=[w])
        train = opt.apply_gradients(pairs)
    a = analyze_graph(graph)
    assert [v.name for v in a.variables] == ["w"]
    assert a.untrained == ["frozen"]
    assert "frozen" not in {s.name for s in a.state}
    info = a.variable("w")
    assert info.grad_tensor == pairs[0][0].name
    assert info.bytes == 4 * 3 * 4
    assert info.slots == ["w/Adam", "w/Adam_1"]
    assert train.name in a.step_ops
    with pytest.raises(KeyError):
        a.variable("frozen")


# ---------------------------------------------------------------- the loss
def test_loss_inside_a_name_scope():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        with tf.name_scope("objective"):
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert loss.name == "objective/Mean:0"
    assert analyze_graph(graph).loss == "objective/Mean:0"


def test_loss_with_a_regularisation_term():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        data = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        loss = tf.add(data, 0.01 * tf.nn.l2_loss(w), name="total")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert analyze_graph(graph).loss == "total:0"


def test_loss_named_with_tf_identity():
    """A common idiom: loss = tf.identity(mean, name="loss"). The loss tf.gradients
    differentiated is "loss:0", not the Mean feeding it."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        mean = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        loss = tf.identity(mean, name="loss")
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert analyze_graph(graph).loss == loss.name == "loss:0"


# ------------------------------------------------------------ MetaGraphDef
@pytest.mark.parametrize("kind,optimizer,kwargs", [
    ("mlp", "sgd", dict(minimize=True, global_step=False)),
    ("mlp", "adam", dict(clip=True)),
    ("emb", "adagrad", dict(clip=True, ema=True)),
    ("mlp", "momentum", dict(minimize=True, use_resource=False)),
], ids=["sgd-nostate", "adam-clip", "emb-clip-ema", "ref-momentum"])
@pytest.mark.slow
def test_meta_graph_def_gives_the_same_analysis(kind, optimizer, kwargs):
    case = build_case(kind, optimizer, **kwargs)
    with case.graph.as_default():
        meta = tf1.train.export_meta_graph(graph=case.graph)
    assert isinstance(meta, tf1.MetaGraphDef)
    from_graph = analyze_graph(case.graph)
    from_meta = analyze_graph(meta)
    assert from_meta.to_dict() == from_graph.to_dict()


@pytest.mark.slow
def test_state_update_ops_exclude_saver_restore_ops():
    """A tf.compat.v1.train.Saver in the user's graph writes every variable when it
    restores; that is not a per-step update of the state."""
    case = build_case("mlp", "adam", minimize=True, ema=True)
    with case.graph.as_default():
        tf1.train.Saver()
    a = analyze_graph(case.graph)
    for s in a.state:
        assert not any(u.startswith("save/") for u in s.update_ops), (s.name, s.update_ops)
    gs = next(s for s in a.state if s.kind == "global_step")
    assert gs.update_ops == [case.apply_op.name]


# ---------------------------------------------------------- unsupported graphs
def test_forward_pass_only_is_unsupported():
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        tf.reduce_mean(tf.matmul(x, w), name="loss")
    with pytest.raises(UnsupportedGraphError) as info:
        analyze_graph(graph)
    message = str(info.value)
    assert "no gradient" in message
    assert "optimizer" in message


def test_hand_written_update_is_recognised_from_data_flow():
    """w.assign_sub(0.1 * dL/dw) with no optimizer: the write is fed by w's
    gradient, so it is w's update (the gradient it reads is aggregated first,
    as for any optimizer's), found from data flow, not refused."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        gw, = tf.gradients(loss, [w])
        w.assign_sub(tf.multiply(gw, 0.1, name="scaled_grad"), name="manual_update")
    info = analyze_graph(graph).variable("w")
    assert "manual_update" in info.update_ops and info.grad_tensor == gw.name
    assert info.recognised.startswith("writes of it and of its slots fed by its gradient")
    assert info.slots == []


def test_hand_written_update_next_to_an_optimizer_is_not_silently_untrained():
    """w is trained by GradientDescent, v by a hand-written assign_sub of its
    gradient: both are updates (v's from data flow), neither is reported as
    never updated."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        v = tf1.get_variable("v", [4, 3])
        loss = tf.reduce_mean(tf.matmul(x, w) + tf.matmul(x, v), name="loss")
        gw, gv = tf.gradients(loss, [w, v])
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(gw, w)])
        v.assign_sub(tf.multiply(gv, 0.1, name="scaled_grad"), name="manual_update")
    analysis = analyze_graph(graph)
    assert analysis.untrained == []
    assert analysis.variable("w").recognised.startswith("its tf.compat.v1 optimizer's update")
    assert analysis.variable("v").grad_tensor == gv.name
    assert "manual_update" in analysis.variable("v").update_ops


def test_write_fed_by_another_variables_gradient_is_refused_naming_the_op():
    """A write of w fed only by v's gradient: no gradient of w's shape reaches
    it, so what it computes is not w's update by any rule: refused."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [8, 4], name="x")
        w = tf1.get_variable("w", [4, 3])
        v = tf1.get_variable("v", [4, 5])
        loss = tf.reduce_mean(tf.matmul(x, v), name="loss") + 0 * tf.reduce_sum(w)
        gv, = tf.gradients(loss, [v])
        w.assign_sub(tf.multiply(gv[:, :3], 0.1, name="borrowed"), name="odd_update")
        tf1.train.GradientDescentOptimizer(0.1).apply_gradients([(gv, v)])
    with pytest.raises(UnsupportedGraphError, match="'w'.*no gradient of shape \\[4, 3\\]"):
        analyze_graph(graph)


def test_not_a_graph_is_a_type_error():
    with pytest.raises(TypeError):
        analyze_graph("not a graph")


# ------------------------------------------------------------------ imports
_IMPORT_EACH = """
import json, os, sys
import tensorflow  # noqa: F401 - the third-party part, imported once for every module below
failures = {}
for module in sys.argv[1:]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # a child that has imported nothing of autopar
        os.close(read)
        try:
            __import__("autopar.transforms." + module)
        except BaseException as exc:
            os.write(write, f"{type(exc).__name__}: {exc}".encode()[-2000:])
            os._exit(1)
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode()
    if os.waitpid(pid, 0)[1] != 0:
        failures[module] = message or "exited non-zero"
print(json.dumps(failures))
"""


@pytest.mark.slow
def test_transforms_modules_import_on_their_own():
    """Each transforms module must be importable first (as `python -c
    "import autopar.transforms.analysis"` or a tool importing only the
    transforms layer would): one interpreter imports TensorFlow, then each
    module is imported in a child forked from it before anything of autopar
    is imported."""
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    modules = ("analysis", "plan", "methods", "rewrite", "report", "compile")
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *modules], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {}


# ------------------------------------------- reachability, against its definition
# The analysis answers its reachability questions for all variables at once
# (bitsets over a one-pass op index); networkx answers them here per variable,
# straight from the definitions, on graphs where the answer is not trivial.

def _reachability_expectations(graph, analysis):
    import networkx as nx
    from autopar.transforms.graph_utils import in_gradient_scope, op_digraph
    data = op_digraph(graph)
    path_ops = {}
    for v in analysis.variables:
        starts = {t.split(":")[0] for t in (v.grad_tensor, v.grad_values, v.grad_indices) if t}
        down = set().union(*(nx.descendants(data, s) for s in starts))
        up = set().union(*(nx.ancestors(data, u) for u in v.update_ops))
        path_ops[v.name] = sorted(n for n in (down & up) - set(v.update_ops)
                                  if not in_gradient_scope(n))
    full = op_digraph(graph, control=True)
    updates = {u for v in analysis.variables for u in v.update_ops}
    step_ops = updates.union(*(nx.descendants(full, u) for u in updates))
    return path_ops, step_ops


@pytest.mark.parametrize("name", ["mlp_adam_clip_ema", "emb_adam_clip", "lm_adagrad_clip",
                                  "embsparse_rmsprop_clip_centered"])
def test_path_and_step_ops_match_their_definition(name):
    """path_ops: ops outside the gradients scope on a data path from a
    gradient's op to one of the variable's update ops; step_ops: the update
    ops and everything after them along data and control edges."""
    from tests.models import build
    graph = build(name).graph
    a = analyze_graph(graph)
    path_ops, step_ops = _reachability_expectations(graph, a)
    assert {v.name: v.path_ops for v in a.variables} == path_ops
    assert sum(len(p) for p in path_ops.values()) > len(a.variables)   # clipping is in there
    assert a.step_ops == step_ops


def test_path_ops_through_a_loop_between_gradient_and_update():
    """A gradient scaled inside a tf.compat.v1 while loop (control flow v1:
    the loop is a cycle in the graph, NextIteration -> Merge) before the
    update: the loop's ops are on the path, found as networkx finds them."""
    from tensorflow.python.ops import control_flow_util
    was_v2 = control_flow_util.ENABLE_CONTROL_FLOW_V2
    tf1.disable_control_flow_v2()
    try:
        graph = tf.Graph()
        with graph.as_default():
            x = tf1.placeholder(tf.float32, [CASE_BATCH, 3], name="x")
            w = tf1.get_variable("w", [3, 2], initializer=tf1.ones_initializer())
            b = tf1.get_variable("b", [2], initializer=tf1.zeros_initializer())
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b), name="loss")
            opt = tf1.train.GradientDescentOptimizer(0.1)
            pairs = opt.compute_gradients(loss)
            halved = [tf1.while_loop(lambda i, g: i < 2, lambda i, g: (i + 1, g * 0.5),
                                     [tf.constant(0), g])[1] for g, _ in pairs]
            opt.apply_gradients(zip(halved, [v for _, v in pairs]))
    finally:
        if was_v2:
            tf1.enable_control_flow_v2()
    assert any(op.type == "NextIteration" for op in graph.get_operations())
    a = analyze_graph(graph)
    path_ops, step_ops = _reachability_expectations(graph, a)
    assert {v.name: v.path_ops for v in a.variables} == path_ops
    assert any("while" in n for n in path_ops["w"])
    assert a.step_ops == step_ops


# ------------------------------------------- graphs built under V1 behaviour
# Most TF1-era scripts call tf.compat.v1.disable_v2_behavior() first: reference
# variables, V1 control flow and V1 tensor shapes, whose dimensions are
# Dimension objects (unhashable, never `is None`). The analysis must find the
# same facts as in the same program built under V2 behaviour.
_V1_PROGRAM = r'''
import json, sys
import tensorflow as tf
tf1 = tf.compat.v1
if sys.argv[1] == "v1":
    tf1.disable_v2_behavior()
from autopar.transforms.analysis import analyze_graph
graph = tf.Graph()
with graph.as_default():
    x = tf1.placeholder(tf.float32, [None, 3])
    ids = tf1.placeholder(tf.int64, [None, 2])
    y = tf1.placeholder(tf.float32, [None, 1])
    emb = tf1.get_variable("emb", [10, 3])
    w = tf1.get_variable("w", [6, 1])
    b = tf1.get_variable("b", [1])
    h = tf.concat([x, tf.reduce_mean(tf.nn.embedding_lookup(emb, ids), 1)], 1)
    h = tf1.nn.dropout(h, rate=0.5, seed=1)
    scores = tf.matmul(h, h, transpose_b=True)          # every example against every one
    loss = tf.reduce_mean(tf.square(tf.matmul(h, w) + b - y)) + tf.reduce_mean(scores)
    tf1.train.AdamOptimizer(0.1).minimize(loss)
a = analyze_graph(graph)
print(json.dumps({"variables": sorted((v.name, v.gradient, v.shape) for v in a.variables),
                  "slots": sorted(s for v in a.variables for s in v.slots),
                  "loss_reduction": a.loss_reduction, "batch_weights": len(a.batch_weights),
                  "batch_draws": len(a.batch_draws), "batch_mixing": a.batch_mixing}))
'''


@pytest.mark.slow
def test_a_graph_built_under_v1_behaviour_is_analysed_as_under_v2():
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3")
    procs = {behaviour: subprocess.Popen([sys.executable, "-c", _V1_PROGRAM, behaviour],
                                         cwd=REPO, env=env, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
             for behaviour in ("v1", "v2")}
    found = {}
    for behaviour, proc in procs.items():
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]
        found[behaviour] = json.loads(out.strip().splitlines()[-1])
    assert found["v1"] == found["v2"]
    facts = found["v1"]
    assert [v[0] for v in facts["variables"]] == ["b", "emb", "w"]
    assert facts["batch_weights"] == 1 and facts["batch_draws"] >= 1
    assert facts["batch_mixing"]   # the scores matmul


def test_constant_ids_of_the_batchs_shape_are_looked_up_per_example():
    """BERT's segment ids, zeros_like(input_ids) with the batch's size in
    the placeholder, fold into a constant: no example's values give them,
    but each looked-up row is added to its example's token row (not
    broadcast over the batch), so its gradient row is that example's and
    the rows of every worker together are one device's, under a global
    norm too."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int32, [4, 3])
        tokens = tf1.get_variable("tokens", [10, 2])
        segments = tf1.get_variable("segments", [2, 2])
        h = tf.nn.embedding_lookup(tokens, ids) + tf.nn.embedding_lookup(segments,
                                                                         tf.zeros_like(ids))
        loss = tf.reduce_mean(tf.square(h))
        grads = tf.gradients(loss, [tokens, segments])
        clipped, _ = tf.clip_by_global_norm(grads, 1.0)
        tf1.train.AdamOptimizer(0.1).apply_gradients(zip(clipped, [tokens, segments]))
    assert tf.get_static_value(graph.get_tensor_by_name("zeros_like:0")) is not None
    analysis = analyze_graph(graph)
    assert [(v.name, v.gradient, v.dedup) for v in analysis.sparse] == [
        ("tokens", "sparse", False), ("segments", "sparse", False)]
