"""A worker's rewritten graph run in a session of the test's own process."""
import tensorflow as tf

tf1 = tf.compat.v1


def run_locally(graph_def, runs):
    """runs(session) on `graph_def` imported into a session of this process
    alone (its devices cleared), its variables initialised."""
    graph_def = type(graph_def).FromString(graph_def.SerializeToString())
    for node in graph_def.node:
        node.device = ""
    graph = tf.Graph()
    with graph.as_default():
        tf1.import_graph_def(graph_def, name="")
        with tf1.Session(graph=graph) as session:
            session.run([op for op in graph.get_operations() if op.name.endswith("/Assign")])
            return runs(session)


def run_workers_together(rewritten, runs, init_feed=None):
    """runs(session) on the N workers' rewritten graphs (rewrite_for_worker's
    WorkerGraphs) imported into one session of this process, worker w's
    under the scope "w{w}/" on a CPU device of its own (their collectives
    between local devices), its variables initialised and the chief's
    broadcast. `init_feed`: {tensor name: value} fed to every worker's
    initialisation (a lifted step's initial values, LiftedGraph.initial_feed)."""
    n = len(rewritten)
    graph = tf.Graph()
    with graph.as_default():
        for w, r in enumerate(rewritten):
            graph_def = r.meta_graph.graph_def
            for node in graph_def.node:
                node.device = f"/device:CPU:{w}"
            tf1.import_graph_def(graph_def, name=f"w{w}")
    config = tf1.ConfigProto(device_count={"CPU": n})
    with tf1.Session(graph=graph, config=config) as session:
        session.run([op for op in graph.get_operations()
                     if op.type in ("AssignVariableOp", "Assign") and "/Initializer/" in op.name
                     or op.name.endswith("/Assign")],
                    {f"w{w}/{name}": value for w in range(n)
                     for name, value in (init_feed or {}).items()})
        session.run([f"w{w}/{r.broadcast_op}" for w, r in enumerate(rewritten)])
        return runs(session)
