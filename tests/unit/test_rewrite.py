"""transforms.rewrite: one worker's graph of synchronous data-parallel
training. Pure graph checks, no processes, no sessions."""
import collections

import pytest
import tensorflow as tf

from tests.models import build_case, build_shared_gradient_case
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.methods.registry import METHODS

tf1 = tf.compat.v1

BROADCAST = "autopar/broadcast_from_chief"

# (builder kwargs, fusion_bytes): small fusion sizes force several buckets.
SCENARIOS = {
    "mlp-adam": (dict(kind="mlp", optimizer="adam", minimize=True), 100),
    "mlp-momentum-clip-ema-ref": (dict(kind="mlp", optimizer="momentum", clip=True, ema=True,
                                       use_resource=False), 150),
    "emb-adagrad-clip-ema": (dict(kind="emb", optimizer="adagrad", clip=True, ema=True), 40),
    "emb-sgd-ref": (dict(kind="emb", optimizer="sgd", use_resource=False), 64 << 20),
    "f64-rmsprop": (dict(kind="f64", optimizer="rmsprop"), 64 << 20),
}


def in_gradients_scope(name: str) -> bool:
    return any(p == "gradients" or (p.startswith("gradients_") and p[10:].isdigit())
               for p in name.split("/")[:-1])


def device_of(i: int) -> str:
    return f"/job:worker/task:{i}/device:CPU:0"


def import_meta(meta) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf1.train.import_meta_graph(meta)
    return graph


def input_by_arg(op: tf.Operation, arg: str) -> tf.Tensor:
    names = [a.name for a in op.op_def.input_arg]
    return op.inputs[names.index(arg)]


def const_input(op: tf.Operation, arg: str) -> int:
    producer = input_by_arg(op, arg).op
    assert producer.type == "Const", (op.name, arg, producer.type)
    return int(tf.make_ndarray(producer.get_attr("value")))


def gather_key(op: tf.Operation) -> int:
    """The planned key of a gather: its constant instance key, or for a
    variable-size row gather (key = block start + ladder rung, computed at run
    time) the block start."""
    producer = input_by_arg(op, "instance_key").op
    if producer.type == "Const":
        return const_input(op, "instance_key")
    assert producer.type == "AddV2", (op.name, producer.type)
    consts = [t.op for t in producer.inputs if t.op.type == "Const"]
    assert len(consts) == 1, op.name
    return int(tf.make_ndarray(consts[0].get_attr("value")))


def ancestors(op: tf.Operation, control: bool) -> set:
    """Names of op and every op it depends on, through data inputs and, with
    ``control``, control inputs too."""
    seen, stack = set(), [op]
    while stack:
        o = stack.pop()
        if o.name in seen:
            continue
        seen.add(o.name)
        stack.extend(t.op for t in o.inputs)
        if control:
            stack.extend(o.control_inputs)
    return seen


def data_ancestors(tensor: tf.Tensor) -> set:
    return ancestors(tensor.op, control=False)


def all_ancestors(op: tf.Operation) -> set:
    return ancestors(op, control=True)


def collectives(graph: tf.Graph, op_type: str) -> list:
    return [op for op in graph.get_operations() if op.type == op_type]


def gradient_names(analysis) -> list:
    out = []
    for v in analysis.variables:
        out += [t for t in (v.grad_tensor, v.grad_values, v.grad_indices) if t]
    return out


class Rewritten:
    def __init__(self, name, num_workers=2):
        kwargs, fusion = SCENARIOS[name]
        self.case = build_case(**kwargs)
        self.graph = self.case.graph
        self.analysis = analyze_graph(self.graph)
        self.plan = make_plan(self.analysis, num_workers, PlanOptions(fusion_bytes=fusion))
        self.num_workers = num_workers
        self.before = [(n.name, n.op, list(n.input)) for n in self.graph.as_graph_def().node]
        self.workers = {}
        self.imported = {}
        for i in range(num_workers):
            with self.graph.as_default():
                self.workers[i] = rewrite_for_worker(self.graph, self.analysis, self.plan, i)
            self.imported[i] = import_meta(self.workers[i].meta_graph)


@pytest.fixture(scope="module", params=list(SCENARIOS))
def rw(request):
    return Rewritten(request.param)


# ------------------------------------------------------------------ tests
def test_imports_cleanly_with_every_node(rw):
    for i, wg in rw.workers.items():
        assert isinstance(wg.meta_graph, tf1.MetaGraphDef)
        names = {op.name for op in rw.imported[i].get_operations()}
        assert {n.name for n in wg.meta_graph.graph_def.node} <= names
        original = {op.name for op in rw.graph.get_operations()}
        assert original <= names


def test_every_node_on_this_workers_cpu(rw):
    for i, wg in rw.workers.items():
        devices = collections.Counter(n.device for n in wg.meta_graph.graph_def.node)
        assert set(devices) == {device_of(i)}, devices


def test_user_graph_unchanged(rw):
    after = [(n.name, n.op, list(n.input)) for n in rw.graph.as_graph_def().node]
    assert len(after) == len(rw.before)
    assert after == rw.before


def test_gradient_consumers_read_the_averaged_tensor(rw):
    grads = gradient_names(rw.analysis)
    original_consumers = []   # (op name, input index) outside the gradients scope
    for op in rw.graph.get_operations():
        if in_gradients_scope(op.name):
            continue
        for k, t in enumerate(op.inputs):
            if t.name in grads:
                original_consumers.append((op.name, k, t.name))
    assert original_consumers
    # every optimizer kernel and, with clipping, the clip ops, read a gradient
    for v in rw.analysis.variables:
        assert any(c[0] in v.update_ops or c[0] in v.path_ops for c in original_consumers)
    for i in rw.workers:
        g = rw.imported[i]
        for op_name, k, old in original_consumers:
            new = g.get_operation_by_name(op_name).inputs[k]
            assert new.name.startswith("autopar/average/"), (op_name, k, new.name)
            assert new.dtype == rw.graph.get_tensor_by_name(old).dtype
            assert rw.workers[i].replaced[old] == new.name
        for op in g.get_operations():
            if op.name.startswith("autopar/") or in_gradients_scope(op.name):
                continue
            assert not {t.name for t in op.inputs} & set(grads), op.name
        assert set(rw.workers[i].replaced) == set(grads)


def test_averaged_tensor_comes_from_the_planned_collective(rw):
    for i in rw.workers:
        g = rw.imported[i]
        reduce_key = {op.name: const_input(op, "instance_key")
                      for op in collectives(g, "CollectiveReduceV2")}
        gather_keys = {op.name: gather_key(op) for op in collectives(g, "CollectiveGatherV2")}
        for v in rw.analysis.variables:
            vp = rw.plan.variable(v.name)
            if v.gradient == "dense":
                new = g.get_tensor_by_name(rw.workers[i].replaced[v.grad_tensor])
                up = data_ancestors(new)
                assert {reduce_key[n] for n in up if n in reduce_key} == \
                    {METHODS["allreduce"].state(rw.plan).buckets[vp.bucket].instance_key}
                assert not up & set(gather_keys)
                assert v.grad_tensor.split(":")[0] in up
                assert tuple(new.shape.as_list()) == v.shape
            else:
                values = g.get_tensor_by_name(rw.workers[i].replaced[v.grad_values])
                indices = g.get_tensor_by_name(rw.workers[i].replaced[v.grad_indices])
                vk = {gather_keys[n] for n in data_ancestors(values) if n in gather_keys}
                ik = {gather_keys[n] for n in data_ancestors(indices) if n in gather_keys}
                assert vk == {vp.keys["count"], vp.keys["values"]}
                assert ik == {vp.keys["count"], vp.keys["indices"]}
                assert values.shape.is_compatible_with([None, *v.shape[1:]])
                assert indices.shape.is_compatible_with([None])
                assert indices.dtype == g.get_tensor_by_name(v.grad_indices).dtype


def test_collective_counts_and_keys(rw):
    sparse = [v for v in rw.plan.variables if v.method == "allgather"]
    dtypes = {v.dtype.base_dtype.name
              for v in rw.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
    for i in rw.workers:
        g = rw.imported[i]
        reduces = collectives(g, "CollectiveReduceV2")
        gathers = collectives(g, "CollectiveGatherV2")
        assert len(reduces) == len(METHODS["allreduce"].state(rw.plan).buckets)
        assert len(gathers) == 3 * len(sparse)
        assert sorted(const_input(op, "instance_key") for op in reduces) == \
            sorted(b.instance_key for b in METHODS["allreduce"].state(rw.plan).buckets)
        assert sorted(gather_key(op) for op in gathers) == \
            sorted(k for vp in sparse for k in vp.keys.values())
        sends = collectives(g, "CollectiveBcastSendV2")
        recvs = collectives(g, "CollectiveBcastRecvV2")
        bcasts = sends + recvs
        assert sorted(const_input(op, "instance_key") for op in bcasts) == \
            [rw.plan.broadcast_key_base + k for k in range(len(dtypes))]
        for op in reduces + gathers + bcasts:
            assert const_input(op, "group_key") == rw.plan.group_key
            assert const_input(op, "group_size") == rw.num_workers
        for op in reduces:
            assert op.get_attr("merge_op") == b"Add"
            assert op.get_attr("final_op") == b"Div"


def test_chief_sends_the_others_receive(rw):
    for i in rw.workers:
        g = rw.imported[i]
        assert rw.workers[i].broadcast_op == BROADCAST
        bcast = g.get_operation_by_name(BROADCAST)
        sends = collectives(g, "CollectiveBcastSendV2")
        recvs = collectives(g, "CollectiveBcastRecvV2")
        up = all_ancestors(bcast)
        if i == 0:
            assert sends and not recvs
            assert {op.name for op in sends} <= up
        else:
            assert recvs and not sends
            assert {op.name for op in recvs} <= up


def test_non_chief_overwrites_every_global_variable(rw):
    """Worker 1 assigns every global variable (weights, slots, global step, EMA
    shadows, Adam powers) from what it received; the chief assigns nothing."""
    variables = {v.op.name for v in rw.graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
    writes = {"AssignVariableOp", "Assign"}
    for i in rw.workers:
        g = rw.imported[i]
        up = all_ancestors(g.get_operation_by_name(BROADCAST))
        assigned = {op.inputs[0].op.name for op in g.get_operations()
                    if op.name.startswith("autopar/broadcast/") and op.type in writes
                    and op.name in up}
        assert assigned == (set() if i == 0 else variables)


def test_third_worker_receives():
    rw = Rewritten("emb-adagrad-clip-ema", num_workers=3)
    g = rw.imported[2]
    assert not collectives(g, "CollectiveBcastSendV2")
    assert collectives(g, "CollectiveBcastRecvV2")
    assert {n.device for n in rw.workers[2].meta_graph.graph_def.node} == {device_of(2)}
    for op in collectives(g, "CollectiveReduceV2") + collectives(g, "CollectiveGatherV2"):
        assert const_input(op, "group_size") == 3


def test_workers_differ_only_in_broadcast_and_devices():
    rw = Rewritten("emb-adagrad-clip-ema", num_workers=2)
    nodes = [{n.name: (n.op, list(n.input)) for n in rw.workers[i].meta_graph.graph_def.node}
             for i in (0, 1)]
    common = set(nodes[0]) & set(nodes[1])
    for name in common:
        if not name.startswith("autopar/broadcast"):
            assert nodes[0][name] == nodes[1][name], name
    assert {n for n in set(nodes[0]) ^ set(nodes[1]) if not n.startswith("autopar/broadcast")} \
        == set()


def test_meta_graph_def_input_gives_the_same_nodes():
    case = build_case("emb", "adam", clip=True)
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, 2)
    with case.graph.as_default():
        meta = tf1.train.export_meta_graph(graph=case.graph)
        from_graph = rewrite_for_worker(case.graph, analysis, plan, 1)
    from_meta = rewrite_for_worker(meta, analysis, plan, 1)
    assert ({(n.name, n.op) for n in from_meta.meta_graph.graph_def.node}
            == {(n.name, n.op) for n in from_graph.meta_graph.graph_def.node})
    assert from_meta.replaced == from_graph.replaced


def test_rewrite_outside_the_graph_context_with_eager_on():
    """TF2 leaves eager execution on; a script that built its graph in a
    `with graph.as_default():` block calls autopar after leaving it."""
    case = build_case("mlp", "sgd", minimize=True)
    analysis = analyze_graph(case.graph)
    plan = make_plan(analysis, 2)
    wg = rewrite_for_worker(case.graph, analysis, plan, 0)
    assert collectives(import_meta(wg.meta_graph), "CollectiveReduceV2")


def test_gradient_also_used_inside_the_backward_pass():
    """c's gradient tensor is also what the MatMul backward pass reads to compute
    w's gradient. Only consumers *outside* the gradients scope may be re-pointed
    to the average: re-pointing the backward pass itself would compute w's
    gradient from the averaged tensor (or, with c and w in one bucket, make a
    cycle)."""
    case = build_shared_gradient_case()
    gc = case.grads["c"]
    inner = [op.name for op in gc.consumers() if in_gradients_scope(op.name)]
    assert inner, "the builder no longer shares c's gradient with the backward pass"
    analysis = analyze_graph(case.graph)
    assert analysis.variable("c").grad_tensor == gc.name
    assert analysis.variable("w").grad_tensor == case.grads["w"].name
    for fusion in (64 << 20, 16):   # one bucket for both / one bucket each
        plan = make_plan(analysis, 2, PlanOptions(fusion_bytes=fusion))
        with case.graph.as_default():
            wg = rewrite_for_worker(case.graph, analysis, plan, 0)
        nodes = {n.name: list(n.input) for n in wg.meta_graph.graph_def.node}
        for name in inner:
            assert not any(i.startswith("autopar/") for i in nodes[name]), (fusion, name, nodes[name])
        g = import_meta(wg.meta_graph)   # must not fail with "nodes in a cycle"
        apply_c = g.get_operation_by_name(
            next(u for u in analysis.variable("c").update_ops if "Apply" in u))
        assert input_by_arg(apply_c, "delta").name.startswith("autopar/average/")


def test_a_server_copies_small_constants_it_reads_not_large_ones():
    """A server's op reading a worker's constant reads a copy on its own
    server when the constant is small (a scalar, a shape: a message per step
    otherwise), the worker's own when large (an initial value read once,
    which a copy per server would add to every worker's graph)."""
    import numpy as np
    from autopar.transforms.plan import PlanOptions
    from autopar.transforms.topology import Topology
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 50], name="x")
        w = tf1.get_variable("w", initializer=tf.constant(np.ones((50, 10), np.float32),
                                                          name="big"), use_resource=True)
        b = tf1.get_variable("b", initializer=tf.constant(np.zeros(10, np.float32),
                                                          name="small"), use_resource=True)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b))
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, Topology(("127.0.0.1",) * 2, 2),
                     options=PlanOptions(run_option="ps"))
    worker = rewrite_for_worker(graph, analysis, plan, 0)
    nodes = {n.name: n for n in worker.meta_graph.graph_def.node}
    for assign, const in (("w/Assign", "big"), ("b/Assign", "small")):
        source = nodes[nodes[assign].input[1].split(":")[0]]
        assert nodes[assign].device.startswith("/job:ps")
        assert source.op == "Const" and source.name.startswith(const)
        assert (source.device == nodes[assign].device) is (const == "small"), source.device
    # the copies a feed of the constant feeds too (Runner)
    copy = nodes["b/Assign"].input[1]
    assert worker.constant_copies["small:0"] == [f"{copy}:0"] and "big:0" not in worker.constant_copies


def _ungated_reference_mlp() -> tuple[tf.Graph, tf.Operation]:
    """Two layers of reference variables differentiated as tf_cnn_benchmarks
    does, tf.gradients without gating (an optimizer's compute_gradients
    groups each op's input and weight gradients, which orders the reads
    of a layer's weights before its update by chance)."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4])
        y = tf1.placeholder(tf.float32, [None, 1])
        h = x
        for i, width in enumerate((8, 1)):
            w = tf1.Variable(tf.ones([int(h.shape[1]), width]) * 0.1, name=f"w{i}",
                             use_resource=False)
            h = tf.matmul(h, w)
        loss = tf.reduce_mean(tf.square(h - y))
        params = tf1.trainable_variables()
        grads = tf.gradients(loss, params)
        train = tf1.train.MomentumOptimizer(0.1, 0.9).apply_gradients(zip(grads, params))
    return graph, train


def _two_train_ops_sharing_a_layer():
    """An encoder trained on loss + aux by Adam and a head trained on loss
    by SGD, both in one step (tf.group), reference variables: the
    encoder's gradient is taken through the head's weights, which the
    head's train group does not need."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        enc = tf1.get_variable("enc", [4, 3], use_resource=False)
        head = tf1.get_variable("head", [3, 1], use_resource=False)
        h = tf.tanh(tf.matmul(x, enc))
        loss = tf.reduce_mean(tf.square(tf.matmul(h, head) - y))
        train_head = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[head])
        train_enc = tf1.train.AdamOptimizer(0.01).minimize(
            loss + 0.1 * tf.reduce_mean(tf.square(h)), var_list=[enc])
        train = tf.group(train_head, train_enc)
    return graph, train


@pytest.mark.parametrize("program", ["one train op", "two train ops"])
def test_no_read_of_a_reference_variable_is_left_for_its_update_to_overtake(program):
    """A reference variable's reads share its buffer, which its update
    writes in place (transforms.update_order): every op of the step that
    reads the variable (its read Identity and what consumes that) runs
    before any update of it, in each worker's graph. In the user's graph
    the upper layer's update waits only for its own gradient, while the
    lower layer's gradient still reads the upper layer's weights. With two
    train ops in one step, the head's update need not wait for the
    encoder's gradient, which reads the head's weights: that gradient
    reads a copy taken before the update (before: either, as timing
    decided)."""
    graph, train = (_ungated_reference_mlp() if program == "one train op"
                    else _two_train_ops_sharing_a_layer())
    analysis = analyze_graph(graph)
    plan = make_plan(analysis, 2, PlanOptions(fusion_bytes=1))   # a bucket each
    for i in range(2):
        with graph.as_default():
            worker = import_meta(rewrite_for_worker(graph, analysis, plan, i).meta_graph)
        step = all_ancestors(worker.get_operation_by_name(train.name))
        checked = 0
        for v in analysis.variables:
            var = worker.get_operation_by_name(v.name)
            assert var.type == "VariableV2"
            updates = [worker.get_operation_by_name(u) for u in v.update_ops]
            reads = [c for c in var.outputs[0].consumers() if c not in updates]
            readers = {r.name for r in reads} | {c.name for r in reads for t in r.outputs
                                                 for c in t.consumers()}
            for u in updates:
                late = sorted((readers & step) - all_ancestors(u))
                assert not late, (i, u.name, late)
                checked += 1
        assert checked == 2
