"""How the rewrite is built: one class per synchronisation method in one table,
collectives only from the communication backend, the GraphDef passes usable
alone, and a rewritten graph whose size grows with the variables, not with
their square."""
from pathlib import Path

import tensorflow as tf

from tests import models
from autopar.transforms import rewrite
from autopar.transforms.analysis import analyze_graph
from autopar.transforms.methods.registry import METHODS
from autopar.transforms.placement import Place, place_ops
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.placement import server_device
from autopar.transforms.report import build_report
from autopar.transforms.methods.base import Edits, SyncMethod

tf1 = tf.compat.v1
REPO = Path(__file__).resolve().parents[2]
TWO_HOSTS = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), num_servers=2)


def _ps_case(model="mlp_adam_clip", **options):
    m = models.build(model)
    analysis = analyze_graph(m.graph)
    plan = make_plan(analysis, TWO_HOSTS, options=PlanOptions(run_option="ps", **options))
    return m.graph, analysis, plan


def test_collectives_are_built_only_by_the_backend():
    folders = ("autopar", "transforms", "runtime", "common")
    users = sorted(str(p.relative_to(REPO)) for folder in folders
                   for p in (REPO / folder).rglob("*.py") if "raw_ops.Collective" in p.read_text())
    assert users == ["transforms/comm.py"]


def test_every_planned_method_is_in_the_table_and_the_report_uses_its_cost():
    assert all(isinstance(m, SyncMethod) and m.name == name for name, m in METHODS.items())
    seen = set()
    # herring takes float32 dense gradients: emb_adam_clip is float64
    for model, option, wire in (("emb_adam_clip", "allreduce", "float32"),
                                ("emb_adam_clip", "hybrid", "float32"),
                                ("emb_adam_clip", "ps", "float32"),
                                ("cnn_momentum", "herring", "float32"),
                                ("mlp_sgd", "allreduce", "float16")):
        analysis = analyze_graph(models.build(model).graph)
        plan = make_plan(analysis, TWO_HOSTS,
                         options=PlanOptions(run_option=option, wire_dtype=wire))
        report = build_report(analysis, plan)
        for v, vr in zip(analysis.variables, report.variables):
            method = METHODS[vr.method]
            seen.add(vr.method)
            alpha = 1.0 if v.alpha is None or v.gradient == "dense" else v.alpha
            assert (vr.sent_per_worker, vr.received_per_worker) == method.wire_bytes(
                v, plan.variable(v.name), plan.num_workers, alpha)
    assert seen == set(METHODS)


def test_precomputed_moves_are_applied_instead_of_recomputed():
    graph, analysis, plan = _ps_case()
    moves = place_ops(graph, analysis, plan)
    opau = [m for m in moves if m.rule == "OPAU" and m.place != Place()]
    assert opau

    def devices(**kw):
        wg = rewrite.rewrite_for_worker(graph, analysis, plan, 0, **kw)
        return {n.name: n.device for n in wg.meta_graph.graph_def.node}
    assert devices(moves=moves) == devices()
    # Moved elsewhere by the caller: the rewrite follows the given moves.
    elsewhere = [type(m)(m.op, m.rule, Place(1 - (m.place.server or 0)), m.bytes_saved, m.why)
                 for m in opau]
    placed = devices(moves=elsewhere)
    assert all(placed[m.op] == server_device(m.place.server) for m in elsewhere)


def test_no_op_waits_on_each_push_separately():
    """Ops after the pushes depend on one op standing for them all: a control
    edge per push on each of them made the graph grow with variables squared."""
    graph, analysis, plan = _ps_case()
    pushes = 2 * len(plan.server_variables)   # a push and its counter per variable
    nodes = rewrite.rewrite_for_worker(graph, analysis, plan, 0).meta_graph.graph_def.node
    takes = [n for n in nodes if n.op == "AccumulatorTakeGradient"]
    assert len(takes) == len(plan.server_variables) and pushes > 4
    for n in takes:
        assert sum(i.startswith("^") for i in n.input) <= 1, n
    # Constants are shared and wait for nothing.
    consts = [(n.device, n.attr["dtype"].type, n.attr["value"].SerializeToString())
              for n in nodes if n.op == "Const" and n.name.startswith("autopar/const/")]
    assert consts and len(consts) == len(set(consts))
    assert not [n for n in nodes if n.op == "Const" and n.name.startswith("autopar/const/")
                and n.input]


def test_graph_def_passes_alone():
    g = tf.Graph()
    with g.as_default():
        a = tf.constant(1.0, name="a")
        b = tf.identity(a, name="b")
        tf.identity(b, name="c")
        tf1.no_op(name="d")
        tf.identity(a, name="e")
    graph_def = g.as_graph_def()
    edits = Edits(replaced={"b:0": "a:0"}, devices={"a": server_device(0)},
                  noop_deps={"d": ["a"]}, extra_control={"c": ["d"]},
                  identities={"e": "b:0"})
    worker = "/job:worker/replica:0/task:1/device:CPU:0"
    rewrite._set_devices(graph_def, {"b"}, edits, worker)
    nodes = {n.name: n for n in graph_def.node}
    assert nodes["a"].device == server_device(0)
    assert nodes["b"].device == worker and nodes["c"].device == worker
    rewrite._edit_original_nodes(graph_def, {"b"}, edits)
    assert list(nodes["c"].input) == ["a", "^d"]     # reads the replacement, waits for d
    assert nodes["d"].op == "NoOp" and list(nodes["d"].input) == ["^a"]
    assert nodes["e"].op == "Identity" and list(nodes["e"].input) == ["b"]
    assert list(nodes["b"].input) == ["a"]           # new nodes are left alone


def test_structural_comparison_of_rewrites_sees_every_kind_of_change():
    """bench/rewrite_snapshot.py's comparison (the guard for changes to how
    the rewrite builds a graph): two rewrites of one graph compare equal,
    and a changed collective key, control input, op input or shape does not."""
    from bench.rewrite_snapshot import structural_diff
    graph, analysis, plan = _ps_case("emb_adam_clip")
    original = graph.as_graph_def()
    first, second = (rewrite.rewrite_for_worker(graph, analysis, plan, 0).meta_graph.graph_def
                     for _ in range(2))
    assert structural_diff(original, first, second) == []

    def changed(edit) -> list[str]:
        mutated = tf1.GraphDef()
        mutated.CopyFrom(second)
        edit(next(n for n in mutated.node if edit(n, probe=True)))
        return structural_diff(original, first, mutated)

    def key(n, probe=False):
        if probe:
            return n.name.endswith("instance_key")
        n.attr["value"].tensor.int_val[0] += 1

    def control(n, probe=False):
        if probe:
            return n.op == "AccumulatorTakeGradient" and n.input[-1].startswith("^")
        del n.input[-1]

    def data(n, probe=False):
        if probe:
            return n.op == "ResourceApplyAdam"
        n.input[-1] = n.input[-2]

    def shape(n, probe=False):
        if probe:
            return n.op == "ConditionalAccumulator"
        n.attr["shape"].shape.dim[0].size += 1

    for edit in (key, control, data, shape):
        assert changed(edit), edit.__name__


def test_state_broadcast_assigns_every_replicated_variable_its_piece():
    """The broadcast's per-variable ops are written as NodeDefs around the
    collectives built in the scratch graph: the chief sends the concatenation
    of every replicated variable's value, a receiver assigns each its piece
    of what it receives, and no stand-in for the sent values is left."""
    graph, analysis, plan = _ps_case("mlp_adam_clip", local_aggregation=False)
    with graph.as_default():
        variables = [v.op.name for v in tf1.global_variables()]
    original = {n.name for n in graph.as_graph_def().node}
    for worker in (0, 1):
        wg = rewrite.rewrite_for_worker(graph, analysis, plan, worker)
        nodes = {n.name: n for n in wg.meta_graph.graph_def.node}
        replicated = [v for v in variables if v not in wg.server_variables]
        assert replicated and wg.server_variables
        assert not [n for n in nodes.values() if n.op == "Placeholder" and n.name not in original]
        waits = [i[1:] for i in nodes[wg.broadcast_op].input]
        if worker == 0:
            # One collective per dtype, chained: the op waits for the last.
            sends = [n for n in nodes.values() if n.op == "CollectiveBcastSendV2"]
            assert nodes[waits[-1]] in sends
            sent = []
            for send in sends:
                values = nodes[send.input[0]]
                pieces = values.input[:-1] if values.op == "ConcatV2" else values.input
                sent += [nodes[nodes[p].input[0]].input[0] for p in pieces]   # Reshape(Read(v))
            assert sorted(sent) == sorted(replicated)
            continue
        assigned = {}
        for w in waits:
            if nodes[w].op == "AssignVariableOp":
                piece = nodes[nodes[w].input[1]]   # Reshape(SplitV:k, shape)
                split = nodes[piece.input[0].split(":")[0]]
                assert split.op == "SplitV" and nodes[split.input[0]].op == "CollectiveBcastRecvV2"
                assigned[nodes[w].input[0]] = piece
        assert sorted(assigned) == sorted(replicated)
