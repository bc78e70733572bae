"""Messages between processes in the parameter-server path
(transforms.methods.ps.rewrite): what a worker's step sends to and receives
from the servers, counted on the rewritten graph.

- Reads of a server variable that nothing orders apart (an unrolled LSTM
  reads its kernel at every time step) cross the network once per step, for
  a whole variable and for each partition of a split one; a read ordered
  after the update keeps its own transfer.
- The chief's take of an accumulator waits for the chief's pushes on the
  take's own server, not for a NoOp on the worker (a message from every
  server and one back to every take).
- A sparse push's indices and rows cross in one tensor (one receive for the
  server, not two), and arrive bit for bit.
"""
import numpy as np
import pytest
import tensorflow as tf

from tests import models
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.methods.ps.rewrite import pack_rows, unpack_rows
from autopar.transforms.ops import ConstantPool
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.rewrite import rewrite_for_worker
from autopar.transforms.topology import Topology

tf1 = tf.compat.v1
TWO_HOSTS = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), num_servers=2)
KERNEL = "lstm/kernel"


def _rewrite(m, worker=0, **options):
    analysis = analyze_graph(m.graph)
    plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(run_option="ps", **options))
    nodes = {n.name: n for n in rewrite_for_worker(m.graph, analysis, plan, worker)
             .meta_graph.graph_def.node}
    return nodes, plan


def _step(nodes, roots) -> set[str]:
    seen, stack = set(), list(roots)
    while stack:
        name = stack.pop()
        if name in nodes and name not in seen:
            seen.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    return seen


def _reads(nodes, step, handles) -> list[str]:
    """ReadVariableOps of `handles` the step runs."""
    return sorted(n for n in step if nodes[n].op == "ReadVariableOp"
                  and nodes[n].input[0].split(":")[0] in handles)


def test_the_unrolled_lstm_kernel_crosses_once_per_step():
    m = models.build("lm_adagrad_clip")
    uses = [op for op in m.graph.get_operation_by_name(KERNEL).outputs[0].consumers()
            if op.type == "ReadVariableOp"]
    assert len(uses) >= models.LM_WINDOW          # one read per time step in the program
    for worker in range(3):
        nodes, plan = _rewrite(m, worker)
        assert plan.variable(KERNEL).method == "ps" and len(plan.variable(KERNEL).partitions) == 1
        step = _step(nodes, [m.train_op.name, m.loss.op.name])
        reads = _reads(nodes, step, {KERNEL})
        assert len(reads) == 1 and nodes[reads[0]].device.startswith("/job:ps"), reads
        # every other read is now the kept value, on the worker
        merged = [u.name for u in uses if u.name != reads[0] and u.name in step]
        assert merged and all(nodes[n].op == "Identity" and nodes[n].input == [reads[0]]
                              and nodes[n].device.startswith("/job:worker") for n in merged)


def test_a_split_kernel_is_read_once_per_partition():
    m = models.build("lm_adagrad_clip")
    nodes, plan = _rewrite(m, 1, partitions={KERNEL: 2})
    assert len(plan.variable(KERNEL).partitions) == 2
    step = _step(nodes, [m.train_op.name, m.loss.op.name])
    parts = {n for n in nodes if nodes[n].op == "VarHandleOp"
             and nodes[n].attr["shared_name"].s.decode().startswith(KERNEL + "/part_")}
    assert len(parts) == 2
    assert len(_reads(nodes, step, parts)) == 2


def test_a_read_ordered_after_the_update_keeps_its_own_transfer():
    m = models.build("lm_adagrad_clip")
    with m.graph.as_default():
        kernel = [v for v in tf1.global_variables() if v.op.name == KERNEL][0]
        with tf.control_dependencies([m.train_op]):
            after = tf.reduce_sum(kernel.read_value(), name="kernel_after_update")
    nodes, _ = _rewrite(m, 1)
    step = _step(nodes, [m.train_op.name, m.loss.op.name, after.op.name])
    reads = _reads(nodes, step, {KERNEL})
    assert len(reads) == 2                  # the forward pass's, and the one after the update
    late = [r for r in reads if any(i.startswith("^") for i in nodes[r].input)]
    assert len(late) == 1 and late[0] in _step(nodes, [after.op.name])


@pytest.mark.parametrize("model", ["mlp_adam_clip", "lm_adagrad_clip"])
def test_the_chiefs_takes_wait_on_their_own_server(model):
    m = models.build(model)
    nodes, _ = _rewrite(m, 0)
    takes = [n for n in nodes.values() if n.op.endswith("AccumulatorTakeGradient")]
    assert takes
    for take in takes:
        controls = [i[1:] for i in take.input if i.startswith("^")]
        assert controls, take.name            # the chief's pushes stay in its step
        assert all(nodes[c].device == take.device for c in controls), take.name
        # ... through one NoOp standing for the chief's pushes to that server
        assert all(nodes[c].op == "NoOp" for c in controls)
        pushed = {i.lstrip("^").split(":")[0] for c in controls for i in nodes[c].input}
        assert any(nodes[p].op.endswith("AccumulatorApplyGradient") for p in pushed)
        assert all(nodes[p].device == take.device for p in pushed)


@pytest.mark.parametrize("worker", [0, 2])      # the hosts' pushers (worker 1 shares 0's host)
def test_a_push_receives_nothing_but_its_rows_from_the_worker(worker):
    """Every input of a push that is not the worker's gradient (the
    accumulator, its step, the dense shape) is made on the push's server."""
    m = models.build("lm_adagrad_clip")
    nodes, _ = _rewrite(m, worker, partitions={"embedding": 3})
    pushes = [n for n in nodes.values() if n.op.endswith("AccumulatorApplyGradient")]
    assert pushes
    for push in pushes:
        gradient = 2 if push.op.startswith("Sparse") else 1     # (indices, values) or the gradient
        others = [i for i in push.input if not i.startswith("^")]
        others = others[:2] + others[2 + gradient:]
        assert all(nodes[i.split(":")[0]].device == push.device for i in others), push.name


@pytest.mark.parametrize("worker", [0, 2])
def test_a_sparse_push_takes_one_tensor_from_the_worker(worker):
    """Walking back from each sparse push through the ops on its server, the
    first ops on the worker are one tensor: the packed indices and rows."""
    m = models.build("lm_adagrad_clip")
    nodes, _ = _rewrite(m, worker, partitions={"embedding": 3})
    pushes = [n for n in nodes.values() if n.op == "SparseAccumulatorApplyGradient"]
    assert len(pushes) >= 3
    for push in pushes:
        crossing, seen, stack = set(), set(), [i for i in push.input if not i.startswith("^")]
        while stack:
            tensor = stack.pop()
            name = tensor.split(":")[0]
            if name in seen:
                continue
            seen.add(name)
            if nodes[name].device != push.device:
                crossing.add(tensor if ":" in tensor else tensor + ":0")
            else:
                stack.extend(i for i in nodes[name].input if not i.startswith("^"))
        assert len(crossing) == 1, (push.name, crossing)
        assert nodes[next(iter(crossing)).split(":")[0]].op == "ConcatV2"


@pytest.mark.parametrize("dtype,row", [(tf.float32, [3]), (tf.float64, [2, 2]),
                                       (tf.float16, [5]), (tf.bfloat16, [1])])
@pytest.mark.parametrize("count", [0, 4])
def test_packed_rows_arrive_bit_for_bit(dtype, row, count):
    """Bitcasts and copies only: NaN payloads, -0, infinities, subnormals
    and the largest indices come back unchanged."""
    rng = np.random.default_rng(count)
    bits = {2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.size]
    raw = rng.integers(0, np.iinfo(bits).max, size=[count, *row], dtype=bits, endpoint=True)
    if count:
        flat = raw.reshape(-1)
        flat[:4] = [0, 1, np.iinfo(bits).max, 1 << (8 * dtype.size - 1)]   # 0, subnormal, NaN, -0
    ids = np.array([0, -1, 2**62 + 5, 7][:count], dtype=np.int64)
    with tf.Graph().as_default(), tf1.Session() as sess:
        values = tf.bitcast(tf.constant(raw), dtype)
        values = tf1.placeholder_with_default(values, [None, *row])
        pool = ConstantPool("/device:CPU:0")
        packed = pack_rows(values, tf.constant(ids), pool)
        assert packed.dtype == tf.uint8
        got_values, got_ids = unpack_rows(packed, row, dtype, pool, "/device:CPU:0")
        out_bits, out_ids = sess.run([tf.bitcast(got_values, tf.as_dtype(bits)), got_ids])
    assert out_ids.dtype == np.int64 and out_ids.tolist() == ids.tolist()
    assert out_bits.shape == raw.shape and (out_bits == raw).all()


def test_rows_of_unknown_or_empty_shape_are_not_packed():
    """Such a push keeps its two tensors (a reshape needs the row's bytes)."""
    with tf.Graph().as_default():
        pool = ConstantPool("/device:CPU:0")
        ids = tf1.placeholder(tf.int64, [None])
        for shape in ([None, None], [None, 0, 3]):
            assert pack_rows(tf1.placeholder(tf.float32, shape), ids, pool) is None


@pytest.mark.parametrize("model", ["mlp_adam_clip", "lm_adagrad_clip"])
def test_a_workers_token_wait_needs_no_message_from_it(model):
    """A non-chief's dequeue of its release token waits for nothing on the
    worker (the token implies its pushes were taken); its end-of-step
    barrier still waits for its pushes and collectives."""
    m = models.build(model)
    for worker in (1, 2):
        nodes, _ = _rewrite(m, worker)
        dequeues = [n for n in nodes.values() if n.op == "QueueDequeueV2"]
        assert dequeues
        for d in dequeues:       # nothing it waits for runs on the worker
            waits = _step(nodes, [d.name]) - {d.name}
            assert not [n for n in waits if nodes[n].device.startswith("/job:worker")], d.name
        analysis = analyze_graph(m.graph)
        plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(run_option="ps"))
        wg = rewrite_for_worker(m.graph, analysis, plan, worker)
        barriers = [b for _, b in wg.step_barriers + wg.step_targets]
        # what the runner fetches with a training step: the train op and the barrier
        step = _step(nodes, [m.train_op.name, *barriers])
        assert barriers and all(d.name in step for d in dequeues)
        pushes = [n for n in nodes if nodes[n].op.endswith("AccumulatorApplyGradient")]
        assert all(p in _step(nodes, barriers) for p in pushes)     # still in every step
        collectives = [n for n in nodes if nodes[n].op.startswith("Collective")
                       and n not in barriers and not n.startswith("autopar/broadcast/")]
        assert all(c in _step(nodes, barriers) for c in collectives)


@pytest.mark.parametrize("model", ["mlp_adam_clip", "lm_adagrad_clip"])
def test_a_workers_pushes_send_no_ordering_back_to_it(model):
    """A non-chief's pushes run as targets fetched with the step, on their
    servers: no op on the worker waits for them (each such wait was a
    message from every server back to the worker per step)."""
    m = models.build(model)
    analysis = analyze_graph(m.graph)
    plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(run_option="ps"))
    wg = rewrite_for_worker(m.graph, analysis, plan, 2)      # host 2's only worker: it pushes
    nodes = {n.name: n for n in wg.meta_graph.graph_def.node}
    pushes = {n for n in nodes if nodes[n].op.endswith("AccumulatorApplyGradient")}
    assert pushes
    targets = [t for _, t in wg.step_targets]
    assert targets and all(nodes[t].device.startswith("/job:ps") for t in targets)
    assert pushes <= _step(nodes, targets)
    for n in nodes.values():
        if not n.device.startswith("/job:worker"):
            continue
        waits = _step(nodes, [i[1:] for i in n.input if i.startswith("^")])
        assert not waits & pushes, n.name
