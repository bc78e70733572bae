"""Snapshot the rewritten worker graphs of the test models and compare two
snapshots structurally: a guard for changes to how the rewrite builds its
graphs (not what they compute).

    .venv/bin/python -m bench.rewrite_snapshot dump /tmp/before
    .venv/bin/python -m bench.rewrite_snapshot dump /tmp/after
    .venv/bin/python -m bench.rewrite_snapshot compare /tmp/before /tmp/after

Cases: every model of tests/models.py used by the tests x run option
(allreduce, hybrid, ps, herring) x workers 0, 1, 2 of a 3-worker, 2-host,
2-server topology, a few option variants (local-state averaging, batch-norm
groups, weight-update sharding, micro-batches, no local aggregation, wire dtypes), the
3-layer BERT-style graph (hidden 64), and small graphs of the cross-cutting
graph features the models lack (transforms/features: loss counts, batch
weights, per-example random draws, batch mixing; TF1 graphs and lifted Keras
steps). Each case also records its analysis (Analysis.to_json), compared as
text.

The comparison (`structural_diff`) identifies every node by a hash of what
it computes: op type, attributes, device and the hashes of its data inputs
(in order) and control inputs (as a set), with the name included only for
the original graph's nodes. New ops may thus be renamed freely; any change
of an original node's inputs, an attribute, a device, a collective's key or
shape, or a missing/extra op shows up as a differing hash. Also compared:
replaced tensors (up to renaming), server variables and partitions.
"""
from __future__ import annotations

import argparse
import hashlib
import pickle
import re
import sys
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

MODELS = ("mlp_sgd", "emb_adam_clip", "mlp_adam_clip_ema", "lm_adam_clip", "cnn_momentum",
          "bncnn_momentum", "lm_adagrad_clip", "mlp_adam_clip", "embsparse_rmsprop_clip_centered",
          "emb_adam_clip_ema", "mlp_lars", "embsum_adagrad", "bn_sgd", "mlp_adam_clip_ema_f32",
          "embsparse_sgd_clip", "emb_sgd", "bag_adam_clip")
OPTIONS = ("allreduce", "hybrid", "ps", "herring")
VARIANTS = (
    ("bn_sgd", "allreduce", {"sync_local_state": "average"}, 1),
    ("bncnn_momentum", "hybrid", {"batch_norm_group": "all", "sync_local_state": "average"}, 1),
    ("bncnn_momentum", "allreduce", {"batch_norm_group": 2}, 1),
    ("mlp_adam_clip", "allreduce", {"shard_weight_update": True}, 1),
    ("emb_adam_clip", "ps", {"local_aggregation": False}, 1),
    ("emb_adam_clip", "ps", {"opau": False, "opsw": False}, 1),
    ("emb_adam_clip", "ps", {"partitions": {"embedding": 2}}, 1),
    ("mlp_adam_clip", "hybrid", {}, 2),
    ("emb_adam_clip", "ps", {}, 2),
    # The wire dtype: the ring in float16 (float32 and float64 buckets, flat
    # and 2-D), herring's buffers in float16 and bfloat16.
    ("mlp_adam_clip", "allreduce", {"wire_dtype": "float16"}, 1),
    ("mlp_adam_clip_ema", "allreduce", {"wire_dtype": "float16"}, 1),
    ("mlp_adam_clip", "allreduce", {"wire_dtype": "float16", "hierarchical_allreduce": True}, 1),
    ("emb_adam_clip", "hybrid", {"wire_dtype": "float16"}, 1),
    ("mlp_adam_clip", "herring", {"wire_dtype": "float16"}, 1),
    ("mlp_adam_clip", "herring", {"wire_dtype": "bfloat16"}, 1),
    ("mlp_adam_clip", "allreduce", {"wire_dtype": "bfloat16"}, 1),
)
WORKERS = (0, 1, 2)


def _cases():
    for model in MODELS:
        for option in OPTIONS:
            yield f"{model}-{option}", model, option, {}, 1
    for model, option, extra, micro in VARIANTS:
        tag = "-".join(f"{k}={v}" for k, v in extra.items()) + (f"-mb{micro}" if micro > 1 else "")
        yield f"{model}-{option}-{tag}", model, option, extra, micro
    yield "bert3-allreduce", "bert3", "allreduce", {}, 1
    yield "bert3-hybrid", "bert3", "hybrid", {}, 1
    yield "bert3-ps", "bert3", "ps", {}, 1
    for model, option, extra, micro in FEATURE_CASES:
        tag = "".join(f"-{k}={v}" for k, v in extra.items()) + (f"-mb{micro}" if micro > 1 else "")
        yield f"{model}-{option}{tag}", model, option, extra, micro


# Graphs of the cross-cutting features (transforms/features), built here
# small: name -> a function returning the graph.
FEATURE_CASES = (
    ("loss_count_tf1", "allreduce", {}, 1),
    ("loss_count_tf1", "allreduce", {}, 2),
    ("loss_count_keras_masked", "allreduce", {}, 1),
    ("batch_weights_two_trainers", "allreduce", {}, 1),
    ("batch_weights_keras_emb", "hybrid", {}, 1),
    ("draws_dropout", "allreduce", {}, 1),
    ("draws_dropout_static", "ps", {}, 1),
    ("mixing_centred", "allreduce", {}, 1),
)


_KEEP: list = []


def _feature_graph(name: str):
    import tensorflow as tf
    tf1 = tf.compat.v1
    from autopar.transforms.lift import lift
    from tests.programs import keras_step
    if name in ("loss_count_keras_masked", "batch_weights_keras_emb"):
        with keras_step.keras_settings_kept():
            if name == "loss_count_keras_masked":
                _, keep, concrete = keras_step.sequence_step(mask_zero=True)
            else:
                keep = keras_step.build("emb_mlp", "adam", "float64")
                concrete = keep.concrete
            graph = lift(concrete).graph
            _KEEP.append(keep)   # the trace references the optimizer's variables
            return graph
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(7)
        if name == "loss_count_tf1":   # a token mean: divided by a mask's sum
            ids = tf1.placeholder(tf.int32, [None, 3], name="ids")
            emb = tf1.get_variable("emb", [10, 4], tf.float64)
            w = tf1.get_variable("w", [4, 10], tf.float64)
            logits = tf.einsum("bti,iv->btv", tf.nn.embedding_lookup(emb, ids), w)
            per = tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.roll(ids, 1, axis=1), logits=logits)
            mask = tf.cast(tf.not_equal(ids, 0), tf.float64)
            loss = tf.reduce_sum(per * mask) / tf.maximum(tf.reduce_sum(mask), 1.0)
            tf1.train.MomentumOptimizer(0.1, 0.9).minimize(loss)
        elif name == "batch_weights_two_trainers":   # batches of unknown size, two train ops
            for part in ("a", "b"):
                x = tf1.placeholder(tf.float32, [None, 3], name=f"x{part}")
                w = tf1.get_variable(f"w{part}", [3, 1])
                train = tf1.train.GradientDescentOptimizer(0.1).minimize(
                    tf.reduce_mean(tf.square(tf.matmul(x, w))))
                tf1.add_to_collection("train", train)
        elif name.startswith("draws_dropout"):   # a dropout mask per example
            x = tf1.placeholder(tf.float64, [6 if name.endswith("static") else None, 5], name="x")
            h = tf.identity(tf1.nn.dropout(x, rate=0.5), name="drawn")
            w = tf1.get_variable("w", [5, 1], tf.float64)
            tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(h, w) ** 2))
        elif name == "mixing_centred":   # each query less the batch's mean query
            x = tf1.placeholder(tf.float64, [None, 3], name="x")
            y = tf1.placeholder(tf.float64, [None, 3], name="y")
            q = tf.matmul(x, tf1.get_variable("wq", [3, 4], tf.float64), name="q")
            k = tf.matmul(y, tf1.get_variable("wk", [3, 4], tf.float64), name="k")
            centred = q - tf.reduce_mean(q, axis=0, keepdims=True, name="batch_mean")
            tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.square(centred - k)))
        else:
            raise KeyError(name)
    return graph


def dump(out: Path, only: str | None = None) -> None:
    from tests import models
    from bench.bert_graph import build as build_bert
    from autopar.transforms.analysis import analyze_graph
    from autopar.transforms.placement import place_ops
    from autopar.transforms.plan import PlanOptions, make_plan
    from autopar.transforms.topology import Topology
    from autopar.transforms.rewrite import rewrite_for_worker
    topology = Topology(("127.0.0.1", "127.0.0.1", "127.0.0.2"), num_servers=2)
    out.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for case, model, option, extra, micro in _cases():
        if only and only not in case:
            continue
        if model not in graphs:
            graphs[model] = (build_bert(3, 64, heads=1)[0] if model == "bert3"
                             else _feature_graph(model) if model in {c[0] for c in FEATURE_CASES}
                             else models.build(model).graph)
        graph = graphs[model]
        record = {"original": graph.as_graph_def().SerializeToString(), "workers": {}}
        try:
            analysis = analyze_graph(graph)
            record["analysis"] = analysis.to_json()
            plan = make_plan(analysis, topology, options=PlanOptions(run_option=option, **extra))
            moves = place_ops(graph, analysis, plan)
            for w in WORKERS:
                wg = rewrite_for_worker(graph, analysis, plan, w, moves=moves,
                                        micro_batches=micro)
                record["workers"][w] = {
                    "graph_def": wg.meta_graph.graph_def.SerializeToString(),
                    "replaced": dict(wg.replaced), "server_variables": set(wg.server_variables),
                    "partitions": {name: {"handles": list(v.handles),
                                          "layout": [v.layout.rows, v.layout.n, v.layout.dealt]}
                                   for name, v in wg.partitions.items()},
                    "broadcast_op": wg.broadcast_op,
                    "step_barriers": list(wg.step_barriers),
                    "step_targets": list(wg.step_targets), "after_step": wg.after_step,
                    "in_step": wg.in_step, "accumulate_first": wg.accumulate_first,
                    "accumulate": wg.accumulate,
                    "collections": sorted(wg.meta_graph.collection_def.keys())}
        except Exception as e:   # noqa: BLE001 - an unsupported combination is part of the record
            record["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        (out / f"{case}.pkl").write_bytes(pickle.dumps(record))
        print(case, record.get("error", "ok"), flush=True)


_NAMING = frozenset({"Const", "VarHandleOp"})


def _node_hashes(graph_def, original: set[str]) -> dict[str, str]:
    """Name -> hash of what the node computes (see the module docstring)."""
    nodes = {n.name: n for n in graph_def.node}
    memo: dict[str, str] = {}
    bit = {name: 1 << i for i, name in enumerate(nodes)}
    from tensorflow.python.framework import op_def_registry
    defaults: dict[str, dict] = {}
    ancestors: dict[str, int] = {}   # name -> bitset of every node it depends on

    def producer(inp: str) -> tuple[str, str]:
        name = inp.lstrip("^")
        op, _, index = name.partition(":")
        return op, index or "0"

    for root in nodes:
        stack = [root]
        while stack:
            name = stack[-1]
            if name in memo:
                stack.pop()
                continue
            node = nodes[name]
            pending = [p for p, _ in map(producer, node.input) if p not in memo and p in nodes]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            h = hashlib.sha1()
            h.update(node.op.encode())
            # A cluster's jobs have one replica: "/replica:0" names nothing.
            h.update(node.device.replace("/replica:0/", "/").encode())
            if name in original:
                h.update(b"name:" + name.encode())
            if node.op not in defaults:
                op_def = op_def_registry.get(node.op)
                defaults[node.op] = {} if op_def is None else {
                    a.name: a.default_value for a in op_def.attr if a.HasField("default_value")}
            for key in sorted(node.attr):
                if node.attr[key] == defaults[node.op].get(key):
                    continue   # an import adds an attribute left at its default back
                if key in ("_output_shapes", "_has_manual_control_dependencies"):
                    # Inferred shapes an export may add, tf.function's marks
                    # of control dependencies: a session reads neither.
                    continue
                h.update(key.encode())
                value = node.attr[key]
                if value.HasField("func"):
                    # A function's name ends in a process-wide counter.
                    h.update(re.sub(r"_\d+$", "", value.func.name).encode())
                    continue
                if key == "_gradient_op_type":
                    # "CustomGradient-<a process-wide uid>": which uid a
                    # traced program's op got depends on what the process
                    # built before it, not on the rewrite.
                    h.update(re.sub(rb"-\d+$", b"", value.s))
                    continue
                h.update(value.SerializeToString(deterministic=True))
            data = [f"{memo.get(p, 'missing:' + p)}:{i}" for p, i in
                    (producer(x) for x in node.input if not x.startswith("^"))]
            # A constant or a VarHandleOp only names a value or a resource: a
            # control input on it orders its consumers, so it counts as
            # theirs; and a control input already implied by another input's
            # ancestry orders nothing.
            inputs = [producer(x)[0] for x in node.input]
            controls = {producer(x)[0] for x in node.input if x.startswith("^")}
            ordered = 0   # ancestors through the other inputs
            for x, p in zip(node.input, inputs):
                q = nodes.get(p)
                if q is None:
                    continue
                if not x.startswith("^") and q.op in _NAMING:
                    controls |= {producer(c)[0] for c in q.input if c.startswith("^")}
                else:
                    ordered |= ancestors.get(p, 0)
            mine = 0
            for p in inputs:
                mine |= ancestors.get(p, 0) | bit.get(p, 0)
            ancestors[name] = mine
            control = [] if node.op in _NAMING else sorted(
                {memo.get(p, "missing:" + p) for p in controls
                 if not ordered & bit.get(p, 0)})
            h.update(repr((data, control)).encode())
            memo[name] = h.hexdigest()
    return memo


# Side-effect-free op types: a new node of these types nothing consumes
# never runs (the rewrite's outputs the runtime fetches are NoOps or
# collectives), so the comparison ignores it.
_PURE = frozenset({"Const", "ReadVariableOp", "Identity", "Reshape", "ConcatV2", "Shape",
                   "Placeholder"})


def live_nodes(graph_def, original: set[str]):
    """`graph_def` without the new pure nodes nothing consumes (transitively)."""
    from tensorflow.core.framework import graph_pb2
    nodes = list(graph_def.node)
    while True:
        consumed = {i.lstrip("^").split(":")[0] for n in nodes for i in n.input}
        keep = [n for n in nodes if n.name in original or n.op not in _PURE
                or n.name in consumed]
        if len(keep) == len(nodes):
            break
        nodes = keep
    out = graph_pb2.GraphDef()
    out.node.extend(nodes)
    return out


def _step_barriers(record: dict) -> list:
    """[(train groups, barrier op)] of a worker's record (a snapshot taken
    before train groups had one barrier, "step_barrier", for group 0)."""
    if "step_barriers" in record:
        return [(tuple(g), op) for g, op in record["step_barriers"]]
    return [((0,), record["step_barrier"])] if record.get("step_barrier") else []


def structural_diff(original_def, before_def, after_def) -> list[str]:
    """Differences between two rewrites of one original GraphDef (empty: the same graph)."""
    original = {n.name for n in original_def.node}
    before_def, after_def = live_nodes(before_def, original), live_nodes(after_def, original)
    hb, ha = _node_hashes(before_def, original), _node_hashes(after_def, original)
    problems = []
    for name in sorted(original):
        if hb.get(name) != ha.get(name):
            problems.append(f"original node {name} differs")
    # Equal new constants (or handles of one shared resource) on one device
    # may be one node or several (a pool shares them): their consumers hash
    # alike either way, so each counts once.
    consts = {n.name for g in (before_def, after_def) for n in g.node
              if n.op in ("Const", "VarHandleOp")}
    new_b = Counter(h for n, h in hb.items() if n not in original and n not in consts)
    new_a = Counter(h for n, h in ha.items() if n not in original and n not in consts)
    new_b.update({h for n, h in hb.items() if n not in original and n in consts})
    new_a.update({h for n, h in ha.items() if n not in original and n in consts})
    if new_b != new_a:
        ops_b = Counter(n.op for n in before_def.node if n.name not in original)
        ops_a = Counter(n.op for n in after_def.node if n.name not in original)
        problems.append(f"new ops differ: {sum((new_b - new_a).values())} only before, "
                        f"{sum((new_a - new_b).values())} only after; op types "
                        f"before-after {dict(ops_b - ops_a)} after-before {dict(ops_a - ops_b)}")
    return problems


def _partition_record(v, hashes: dict) -> tuple:
    """(the partitions' handles' hashes, their row layout or None for dealt)."""
    if isinstance(v, list):
        return [hashes.get(n) for n in v], None
    layout = None if v["layout"][2] else tuple(v["layout"])
    return [hashes.get(n) for n in v["handles"]], layout


def compare(before: Path, after: Path, verbose: bool = False) -> int:
    from tensorflow.core.framework import graph_pb2
    from autopar.transforms.methods.herring.transport import herring_ops
    herring_ops()   # its ops' attribute defaults
    failures = compared = missing = 0
    for path in sorted(before.glob("*.pkl")):
        b = pickle.loads(path.read_bytes())
        other = after / path.name
        if not other.exists():
            missing += 1
            continue
        compared += 1
        a = pickle.loads(other.read_bytes())
        if "analysis" in b and "analysis" in a and b["analysis"] != a["analysis"]:
            print(f"{path.stem}: the analysis differs")
            failures += 1
            continue
        if b.get("error") or a.get("error"):
            if b.get("error") != a.get("error"):
                print(f"{path.stem}: error before {b.get('error')!r}, after {a.get('error')!r}")
                failures += 1
            continue
        original = graph_pb2.GraphDef.FromString(b["original"])
        names = {n.name for n in original.node}
        for w, wb in b["workers"].items():
            wa = a["workers"][w]
            gb = graph_pb2.GraphDef.FromString(wb["graph_def"])
            ga = graph_pb2.GraphDef.FromString(wa["graph_def"])
            problems = structural_diff(original, gb, ga)
            gb, ga = live_nodes(gb, names), live_nodes(ga, names)
            hb, ha = _node_hashes(gb, names), _node_hashes(ga, names)
            def canon(replaced, hashes):
                return {k: f"{hashes.get(v.split(':')[0])}:{(v.split(':') + ['0'])[1]}"
                        for k, v in replaced.items()}
            if canon(wb["replaced"], hb) != canon(wa["replaced"], ha):
                problems.append("replaced tensors differ")
            for key in ("server_variables", "collections"):
                if wb[key] != wa[key]:
                    problems.append(f"{key} differ")
            # a partitioned variable's partitions' handles, in order, and which
            # rows each holds (a snapshot taken before row layouts existed: a
            # list of handles, rows dealt)
            pb, pa = ({k: _partition_record(v, h) for k, v in w["partitions"].items()}
                      for w, h in ((wb, hb), (wa, ha)))
            if pb != pa:
                problems.append("partitions differ")
            barriers_b, barriers_a = _step_barriers(wb), _step_barriers(wa)
            if [(g, hb.get(op)) for g, op in barriers_b] != [(g, ha.get(op)) for g, op in barriers_a]:
                problems.append("step barriers differ")
            # a snapshot taken before step targets existed has none
            targets_b, targets_a = wb.get("step_targets", []), wa.get("step_targets", [])
            if ([(tuple(g), hb.get(op)) for g, op in targets_b]
                    != [(tuple(g), ha.get(op)) for g, op in targets_a]):
                problems.append("step targets differ")
            for key in ("broadcast_op", "after_step", "accumulate_first", "accumulate", "in_step"):
                # (a snapshot taken before in_step was recorded has none)
                vb, va = wb.get(key), wa.get(key, None) if key in wb else None
                if (vb is None) != (va is None) or (
                        vb and hb.get(vb.split(":")[0]) != ha.get(va.split(":")[0])):
                    problems.append(f"{key} differs")
            status = "same" if not problems else "; ".join(problems[:4]) + (
                f" (+{len(problems) - 4} more)" if len(problems) > 4 else "")
            if problems or verbose:
                print(f"{path.stem} worker {w}: {status}  "
                      f"({len(gb.node)} -> {len(ga.node)} nodes, "
                      f"{gb.ByteSize()} -> {ga.ByteSize()} bytes)")
            failures += bool(problems)
    print(f"{compared} cases compared, {failures} differing"
          + (f", {missing} not in {after}" if missing else ""))
    return failures


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out", type=Path)
    d.add_argument("--only", help="only the cases whose name contains this")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("-v", action="store_true")
    args = p.parse_args()
    if args.cmd == "dump":
        dump(args.out, args.only)
    else:
        raise SystemExit(1 if compare(args.before, args.after, args.v) else 0)


if __name__ == "__main__":
    main()
