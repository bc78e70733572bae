"""A worker's rewritten graph run in a session of the test's own process."""
import numpy as np
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
            session.run([op for op in graph.get_operations() if _initializes(op)])
            return runs(session)


def _initializes(op) -> bool:
    """Whether `op` is a variable's initializer, `v/Assign` of `v` (an
    update such as a V1 Adam's `Adam/Assign` of beta1_power is not)."""
    return op.type in ("AssignVariableOp", "Assign") and bool(op.inputs) \
        and op.name == f"{op.inputs[0].op.name}/Assign"


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
                if node.op in ("Enter", "RefEnter"):
                    # a V1 loop's frame is named by its Enter ops alone:
                    # each worker's its own (one frame per name in a session)
                    node.attr["frame_name"].s = f"w{w}/".encode() + node.attr["frame_name"].s
            tf1.import_graph_def(graph_def, name=f"w{w}")
    config = tf1.ConfigProto(device_count={"CPU": n})
    with tf1.Session(graph=graph, config=config) as session:
        session.run([op for op in graph.get_operations()
                     if op.type in ("AssignVariableOp", "Assign") and "/Initializer/" in op.name
                     or _initializes(op)],
                    {f"w{w}/{name}": value for w in range(n)
                     for name, value in (init_feed or {}).items()})
        session.run([f"w{w}/{r.broadcast_op}" for w, r in enumerate(rewritten)])
        return runs(session)


def trained_alone_and_together(graph, rewritten, train: str, batches, feeds, reads: dict):
    """(what each worker reads, what one device reads) after running the
    op `train` on every batch of `batches` (tuples of arrays, fed to the
    tensor names `feeds`): one device on `graph` alone, each of the N
    workers' `rewritten` graphs in one session on its examples w, w+N, ...
    of each (a training step, its in-step flag fed). `reads`: {key: tensor
    name of `graph`} read after the last batch."""
    n = len(rewritten)

    def train_alone(session):
        for batch in batches:
            session.run(train, dict(zip(feeds, batch)))
        return session.run(reads)

    def train_together(session):
        in_step = {f"w{w}/{r.in_step}": True for w, r in enumerate(rewritten) if r.in_step}
        for batch in batches:
            session.run([f"w{w}/{train}" for w in range(n)],
                        {**{f"w{w}/{name}": value[w::n] for w in range(n)
                            for name, value in zip(feeds, batch)}, **in_step})
        return [session.run({key: f"w{w}/{t}" for key, t in reads.items()}) for w in range(n)]
    expected = run_locally(graph.as_graph_def(), train_alone)
    return run_workers_together(rewritten, train_together), expected


def variable_reads(graph) -> dict:
    """{variable name: the tensor that reads its value} of every global
    variable of `graph`: a resource variable's read made with it (reading
    anew would add an op the workers' rewritten graphs lack), a reference
    variable's snapshot."""
    with graph.as_default():
        return {v.op.name: f"{v.op.name}/Read/ReadVariableOp:0" if v.op.type == "VarHandleOp"
                else v.value().name for v in tf1.global_variables()}


def each_worker_holds(got: list, expected: dict, rtol: float, atol: float) -> None:
    """Every worker's value of every variable and slot (`got`, one dict a
    worker) is one device's (`expected`)."""
    for w, values in enumerate(got):
        for v in expected:
            np.testing.assert_allclose(values[v], expected[v], rtol=rtol, atol=atol,
                                       err_msg=f"worker {w} {v}")
