"""OPAU and OPSW (Parallax §5.3.2) on graphs built to trigger each rule; the
placement is checked in the plan-level result and in the chief's rewritten
graph, where it takes effect."""
import tensorflow as tf

from autopar.transforms.analysis import analyze_graph
from autopar.transforms.placement import Place, place_ops
from autopar.transforms.plan import PlanOptions, make_plan
from autopar.transforms.topology import Topology
from autopar.transforms.placement import server_device
from autopar.transforms.rewrite import rewrite_for_worker, worker_device

tf1 = tf.compat.v1
TOPOLOGY = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), num_servers=2)


def _clipped_graph():
    """Two dense variables and an embedding, gradients clipped by global norm."""
    g = tf.Graph()
    with g.as_default():
        ids = tf1.placeholder(tf.int32, [None, 2])
        y = tf1.placeholder(tf.float32, [None, 4])
        emb = tf1.get_variable("emb", [30, 4])
        a = tf1.get_variable("a", [4, 4])
        b = tf1.get_variable("b", [4, 4])
        h = tf.reduce_mean(tf.nn.embedding_lookup(emb, ids), 1)
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.matmul(h, a), b) - y))
        opt = tf1.train.GradientDescentOptimizer(0.1)
        grads, variables = zip(*opt.compute_gradients(loss))
        clipped, norm = tf.clip_by_global_norm(grads, 1.0)
        opt.apply_gradients(zip(clipped, variables))
    return g, {v.op.name: c.op.name for v, c in zip(variables, clipped)}, norm.op.name


def _plan(g, **options):
    a = analyze_graph(g)
    return a, make_plan(a, TOPOLOGY, options=PlanOptions(**options))


def _where(plan, var):
    return Place(plan.variable(var).servers[0])


def test_opau_global_norm_clipping_in_ps_mode():
    g, clipped, norm = _clipped_graph()
    analysis, plan = _plan(g, run_option="ps")
    moves = {m.op: m for m in place_ops(g, analysis, plan)}
    for var in ("a", "b"):
        info = analysis.variable(var)
        # The L2 term of a dense gradient is local: with its aggregated gradient.
        (term,) = info.norm_ops
        assert moves[term].place == _where(plan, var)
        # The clip multiply uses its own gradient and the shared scalar scale.
        (mul,) = [op for op in info.own_path_ops if g.get_operation_by_name(op).type == "Mul"]
        assert moves[mul].place == _where(plan, var)
    # The global norm combines terms from several processes: first server.
    stack = g.get_operation_by_name(norm).inputs[0].op.inputs[0].op.inputs[0].op
    assert stack.type == "Pack" and moves[stack.name].place == Place(0)
    assert "shared" in moves[stack.name].why
    assert moves[norm].place == Place(0)
    # The sparse gradient's L2 term is all-reduced among workers: not moved.
    (emb_term,) = analysis.variable("emb").norm_ops
    assert emb_term not in moves

    # In the chief's graph the devices follow.
    nodes = {n.name: n for n in rewrite_for_worker(g, analysis, plan, 0).meta_graph.graph_def.node}
    a_server = plan.variable("a").servers[0]
    assert nodes[analysis.variable("a").norm_ops[0]].device == server_device(a_server)
    assert nodes[norm].device == server_device(0)
    # A non-chief runs no post-aggregation op: they stay on the worker.
    nodes1 = {n.name: n for n in rewrite_for_worker(g, analysis, plan, 1).meta_graph.graph_def.node}
    assert nodes1[norm].device == worker_device(1)


def test_opau_hybrid_keeps_dense_clipping_on_workers():
    g, clipped, norm = _clipped_graph()
    analysis, plan = _plan(g, run_option="hybrid")
    moves = {m.op: m for m in place_ops(g, analysis, plan)}
    assert norm not in moves     # all its inputs are on the worker (all-reduced)
    (mul,) = [op for op in analysis.variable("emb").own_path_ops
              if g.get_operation_by_name(op).type == "Mul"]
    assert moves[mul].place == _where(plan, "emb")


def test_opau_off_moves_nothing():
    g, _, _ = _clipped_graph()
    analysis, plan = _plan(g, run_option="ps", opau=False)
    assert not [m for m in place_ops(g, analysis, plan) if m.rule == "OPAU"]


def _boundary_graph():
    """A PS table read through a narrowing cast, a slice, and a gather that
    would grow the data (more ids than rows)."""
    g = tf.Graph()
    with g.as_default():
        x = tf1.placeholder(tf.float32, [None, 8])
        table = tf1.get_variable("table", [100, 8])
        value = table.read_value()
        narrow = tf.cast(value, tf.float16, name="narrow")
        first = tf.slice(value, [0, 0], [10, 8], name="first_rows")
        many = tf.gather(value, tf.range(300) % 100, name="many_rows")
        h = (tf.reduce_sum(tf.cast(narrow, tf.float32)) + tf.reduce_sum(first)
             + tf.reduce_sum(many))
        loss = tf.reduce_mean(x) * h
        tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
    return g


def test_opsw_moves_narrowing_ops_to_the_server_and_keeps_a_growing_gather():
    g = _boundary_graph()
    analysis, plan = _plan(g, run_option="ps")
    moves = {m.op: m for m in place_ops(g, analysis, plan) if m.rule == "OPSW"}
    server = _where(plan, "table")
    assert moves["narrow"].place == server
    assert moves["narrow"].bytes_saved == 100 * 8 * 4 - 100 * 8 * 2
    assert moves["first_rows"].place == server
    assert moves["first_rows"].bytes_saved == (100 - 10) * 8 * 4
    assert moves["many_rows"].place == Place() and moves["many_rows"].bytes_saved == 0
    nodes = {n.name: n for n in rewrite_for_worker(g, analysis, plan, 1).meta_graph.graph_def.node}
    sd = server_device(plan.variable("table").servers[0])
    assert nodes["narrow"].device == sd and nodes["first_rows"].device == sd
    assert nodes["many_rows"].device == worker_device(1)


def test_opsw_off_leaves_boundary_ops_on_workers():
    g = _boundary_graph()
    analysis, plan = _plan(g, run_option="ps", opsw=False)
    assert not place_ops(g, analysis, plan)
    nodes = {n.name: n for n in rewrite_for_worker(g, analysis, plan, 1).meta_graph.graph_def.node}
    assert nodes["narrow"].device == worker_device(1)
