"""Rewrite a single-device graph into one worker's graph of synchronous
data-parallel training (Parallax §3.1 for the AllReduce architecture).

Each worker keeps a full replica. Gradients leaving the backward pass are
averaged across workers *before* anything consumes them, so clipping, slot
updates, the global step and moving averages see exactly what one device with
the global batch would see, and every replica applies the same update.

The rewrite is a pure GraphDef edit: the collective subgraph is built next to
the original ops in a scratch graph, then every consumer of a gradient is
re-pointed to the averaged tensor by editing NodeDef inputs. That uses only
public API (no in-place mutation of tf.Operation inputs).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from autopar.common.roles import SERVER_JOB, WORKER_JOB
from autopar.transforms.accelerator import Accelerator, accelerator_device, place_on_accelerator
from autopar.transforms.analysis import Analysis
from autopar.transforms.comm import CollectiveOpsBackend
from autopar.transforms.graph_utils import (function_calls, import_meta_graph, import_nodes,
                                            in_gradient_scope, initialization_guard,
                                            meta_graph_of, node_input_name, op_name_of,
                                            readers_of, transforming)
from autopar.transforms.partition import PartitionedVariable, copy_region
from autopar.transforms.placement import Move
from autopar.transforms.features.base import FeatureContext, Rewiring
from autopar.transforms.features.registry import FEATURES
from autopar.transforms.barrier import cover_server_work
from autopar.transforms.methods.base import Edits
from autopar.transforms.methods.registry import METHODS
from autopar.transforms.ops import NodeWriter
from autopar.transforms.plan import Plan
from autopar.transforms.update_order import order_updates

tf1 = tf.compat.v1

BROADCAST_OP = "autopar/broadcast_from_chief"


@dataclass
class WorkerGraph:
    meta_graph: tf1.MetaGraphDef
    broadcast_op: str          # run once after init/restore: chief's state to all
    replaced: dict[str, str]   # original tensor -> its replacement (averaged, aggregated)
    server_variables: set[str] = field(default_factory=set)   # live on servers, not replicated
    # (train groups, barrier op): a training step updating those groups
    # fetches every barrier whose groups it updates (see transforms.methods.ps.rewrite)
    step_barriers: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    # (train groups, op on a server): fetched the same way, not waited for by
    # the barrier (Edits.step_targets)
    step_targets: list[tuple[tuple[int, ...], str]] = field(default_factory=list)
    # partitioned variable -> its partitions' handles, in order, and which
    # rows each holds
    partitions: dict[str, PartitionedVariable] = field(default_factory=dict)
    # Config.aggregation_group: an original gather op whose lookup is a
    # collective of the group -> a barrier of every worker waiting for this
    # worker's part of it. A run that is not a training step (which ends with
    # its own barrier) fetches it with the lookup: the lookup's collectives
    # give the run a step id shared with the other workers, and a worker
    # whose run ended first would clean that id up on a server under another
    # group's reads.
    lookup_barriers: dict[str, str] = field(default_factory=dict)
    # Ops the chief runs once with the variables' initialisation (Edits.chief_init)
    chief_init: list[str] = field(default_factory=list)
    # Run after every training step, in its own session.run, by every worker
    # (Config(sync_local_state="average")): batch-local state := its mean.
    after_step: str | None = None
    # micro_batches > 1 (transforms.accumulate): the ops a step's first and
    # later micro-batches run; the user's train op then applies their sum.
    accumulate_first: str | None = None
    accumulate: str | None = None
    # A bool placeholder (default False) a training step's run feeds True:
    # per-example random draws then add up the workers' batch sizes
    # (transforms.random_draws); None when the graph has none.
    in_step: str | None = None
    # A worker constant -> the copies of it on the servers that read it
    # (_constants_on_servers), tensor names: a feed of the constant feeds
    # them too (Runner), so a server's op reads the value fed.
    constant_copies: dict[str, list[str]] = field(default_factory=dict)


def worker_device(worker_index: int) -> str:
    """Worker `worker_index`'s CPU. Without "/replica:0": every job of a
    cluster has the one replica, so TensorFlow places the op on the same
    device, and the string is on every node of a worker's graph (10 bytes
    less each: a tenth of a BERT-large ps-mode graph's growth)."""
    return f"/job:{WORKER_JOB}/task:{worker_index}/device:CPU:0"


def rewrite_for_worker(graph_or_meta, analysis: Analysis, plan: Plan, worker_index: int,
                       moves: list[Move] | None = None, backend=None,
                       micro_batches: int = 1,
                       accelerator: Accelerator | None = None) -> WorkerGraph:
    """Worker `worker_index`'s graph. `moves`: the plan's OPAU/OPSW placement
    when already computed (placement.place_ops), else computed here.
    `backend`: the communication backend building every collective
    (transforms.comm; TensorFlow's collective ops by default).
    `micro_batches` > 1: gradients go through worker-local accumulators
    (transforms.accumulate) before any method aggregates them.
    `accelerator`: the worker owns a GPU; its replica runs there
    (transforms.accelerator; None: on its CPU)."""
    with transforming():
        return _rewrite(graph_or_meta, analysis, plan, worker_index, moves, backend, micro_batches,
                        accelerator)


def _rewrite(graph_or_meta, analysis: Analysis, plan: Plan, worker_index: int,
             moves: list[Move] | None, backend, micro_batches: int,
             accelerator: Accelerator | None = None) -> WorkerGraph:
    meta = _meta_graph(graph_or_meta)
    # A fresh import: never mutate the user's graph. Only features (weight-
    # update sharding, local-state averaging) use the collections' Variables.
    scratch = _scratch_copy(meta, collections=any(f.reads_collections(plan)
                                                  for f in FEATURES.values()),
                            devices=not isinstance(graph_or_meta, tf.Graph)
                            or any(op.device for op in graph_or_meta.get_operations()))
    n_original = len(scratch.get_operations())
    if backend is None:
        backend = CollectiveOpsBackend(plan.num_workers, plan.group_key, plan.communication_hint)
    device = worker_device(worker_index)
    edits = Edits()   # all methods' and features' edits
    ctx = FeatureContext(scratch, analysis, plan, worker_index, backend, device, moves,
                         micro_batches=micro_batches, edits=edits, device_of=worker_device)
    with scratch.as_default(), tf.device(device):
        for method in METHODS.values():
            edits.merge(method.rewrite(ctx))
        rewiring = Rewiring()   # all features'
        built = []   # (feature, its rewiring)
        for feature in FEATURES.values():
            mine = feature.rewrite(ctx)
            if mine is not None:
                rewiring.merge(mine)
                if mine.edits is not None:
                    edits.merge(mine.edits)
                built.append((feature, mine))
        # (after weight-update sharding put the slots on their owners)
        edits.identities.update(_unguarded_initial_values(scratch, edits.server_variables))
        broadcast = _broadcast_state(_global_variables(meta, scratch), plan, backend, worker_index == 0,
                                     edits.server_variables)
        minus_one = ctx.constants.get([-1]).op.name if worker_index == 0 and broadcast else ""
    graph_def, new_nodes = _export(meta, scratch, n_original)
    _stable_function_names(graph_def, {f.signature.name for f in meta.graph_def.library.function})
    new_nodes.update(ctx.nodes.flush(graph_def))
    by_name = {node.name: node for node in graph_def.node}
    new_nodes.update(_splice_broadcast(graph_def, broadcast, worker_index == 0, minus_one, device,
                                       by_name))
    new_nodes -= {g.stand_in for g in broadcast}
    copies = [node for region, p, remap, device_of in edits.copies     # from the unedited nodes
              for node in copy_region(by_name, region, p, remap, device_of)]
    _set_devices(graph_def, new_nodes, edits, device)
    _edit_original_nodes(graph_def, new_nodes, edits)
    if micro_batches == 1:   # (accumulated gradients are applied in a run of their own)
        order_updates(graph_def, analysis, edits.server_variables)
    # The features' rewirings, after the gradient renames: a renamed consumer
    # reads the aggregate, an op reading a replaced tensor (a batch-norm
    # statistic, even from a new op) the feature's replacement.
    rewiring.apply(graph_def)
    graph_def.node.extend(copies)
    constant_copies = _constants_on_servers(graph_def)
    for feature, mine in built:
        feature.edit_graph_def(graph_def, ctx, mine)
    for groups, barrier in edits.step_barriers:
        # What a step of exactly these groups may run: the step ops whose
        # groups are among them.
        cover_server_work(graph_def, barrier, [op for op in analysis.step_ops
                                               if set(analysis.groups_of(op)) <= set(groups)],
                          done=[t for t_groups, t in edits.step_targets
                                if set(t_groups) <= set(groups)])
    if accelerator is not None:
        ordered = {key for method in METHODS.values() for key in method.ordered_collectives(plan)}
        place_on_accelerator(graph_def, device, accelerator_device(worker_index), ordered,
                             accelerator)
    out = _with_graph_def(meta, graph_def)
    return WorkerGraph(meta_graph=out, broadcast_op=BROADCAST_OP, replaced=edits.replaced,
                       server_variables=edits.server_variables,
                       step_barriers=edits.step_barriers, step_targets=edits.step_targets,
                       partitions=edits.partitions,
                       lookup_barriers=edits.lookup_barriers, chief_init=edits.chief_init,
                       constant_copies=constant_copies, **rewiring.outputs)


def _unguarded_initial_values(graph: tf.Graph, server_variables: set[str]) -> dict[str, str]:
    """{guard: the initial value it yields}: for each variable whose initial
    value reads another variable X, TensorFlow guards the read with
    cond(is_initialized(X), X, X's initial value) (an
    ExponentialMovingAverage shadow, say). When X lives on a server (maybe
    split into partitions) the cond runs on a worker while the chief
    initialises X; when X is a reference variable the cond's input reads X
    before the predicate is known: either way whether X is initialised yet
    is a race, and reading it uninitialised fails (seen on busy workers). In
    autopar's start-up every variable is initialised in the same run, when
    either branch gives X's initial value, and the chief's state is then
    broadcast to every replica; so such a guard is replaced by that value.
    Found from data flow: an If whose predicate asks whether its second
    input is initialised."""
    out = {}
    for op in graph.get_operations():
        guarded = initialization_guard(op)
        if guarded is not None and (guarded.name in server_variables
                                    or guarded.type != "VarHandleOp"):
            out[op.name] = op.inputs[2].name
    return out


# The GraphDef passes, in the order rewrite_for_worker applies them. Each
# edits the nodes in place and can be run (and tested) on its own.

def _set_devices(graph_def, new_nodes: set[str], edits: Edits, device: str) -> None:
    """Explicit devices everywhere: new ops where they were built (else the
    worker), original ops where the methods moved them (else the worker).
    New nodes also lose attributes at their default value."""
    defaults: dict[str, list] = {}
    for node in graph_def.node:
        # Colocation hints from the single-device graph (e.g. Adam's powers
        # "with" the first variable) would contradict the explicit devices
        # once variables move to servers.
        node.attr.pop("_class", None)
        if node.name in new_nodes:
            # Ops pinned to a variable by colocation (its reads) carry no
            # device of their own once the colocation hint is gone.
            node.device = node.device or device
            # TensorFlow's Python API marks ops built under or used as control
            # dependencies for tf.function's automatic control dependencies;
            # a session runs a GraphDef without reading it (~40 bytes on
            # thousands of new nodes).
            node.attr.pop("_has_manual_control_dependencies", None)
            _strip_default_attrs(node, defaults)
        elif _is_identity(node.name, edits):
            node.device = device   # recomputes a value on the worker
        else:
            node.device = edits.devices.get(node.name, device)


def _strip_default_attrs(node, defaults: dict[str, list]) -> None:
    """Drop the node's attributes that hold their op's default value (as
    TensorFlow's export with strip_default_attrs does): every import adds
    them back, and on thousands of new nodes (a collective has five, a slice
    four) they were a tenth of a ps-mode graph's growth. `defaults` caches
    (name, default) per op type."""
    if node.op not in defaults:
        from tensorflow.python.framework import op_def_registry
        op_def = op_def_registry.get(node.op)
        defaults[node.op] = [] if op_def is None else [
            (a.name, a.default_value) for a in op_def.attr if a.HasField("default_value")]
    for name, default in defaults[node.op]:
        if name in node.attr and node.attr[name] == default:
            del node.attr[name]


def _is_identity(name: str, edits: Edits) -> bool:
    """Whether _edit_original_nodes turns this node into an Identity."""
    return (name in edits.identities and not in_gradient_scope(name)
            and name not in edits.noop_deps)


def _edit_original_nodes(graph_def, new_nodes: set[str], edits: Edits) -> None:
    """Original ops outside the backward pass: the methods' NoOps and
    Identities replace theirs, every other one reads the replaced tensors
    (averaged or aggregated gradients) and waits for the extra controls."""
    rename = {node_input_name(k): node_input_name(v) for k, v in edits.replaced.items()}
    for node in graph_def.node:
        if node.name in new_nodes or in_gradient_scope(node.name):
            continue   # the backward pass itself keeps using local gradients
        if node.name in edits.noop_deps:
            _make_noop(node)
            node.input.extend("^" + d for d in edits.noop_deps[node.name])
        elif _is_identity(node.name, edits):
            _make_identity(node, edits.identities[node.name])
        else:
            own = edits.inputs.get(node.name, {})
            for i, inp in enumerate(node.input):
                if inp in own:
                    node.input[i] = own[inp]
                elif inp in rename:
                    node.input[i] = rename[inp]
            node.input.extend("^" + c for c in edits.extra_control.get(node.name, []))
    _silence_dead_readers(graph_def, set(edits.noop_deps))


# The largest constant (its serialized value) a server gets a copy of: the
# scalars and shapes a step reads; a large one (a table's initial value, read
# once) would be copied into every worker's graph once per server reading it.
_SERVER_CONST_BYTES = 1024


def _constants_on_servers(graph_def) -> dict[str, list[str]]:
    """Each server gets its own copy of every small constant of the worker
    its ops read (a constant with no control input); {constant's tensor:
    its copies' tensors}. Read across, it was a message per step, and a
    server's functional cond (Keras's Adagrad's sparse division) passing
    such a constant through to an output no op reads left that transfer
    pending past the step's barrier: a peer finishing its step cleaned the
    step up on the server under it ("Aborted: Cleanup <step id>")."""
    nodes = {n.name: n for n in graph_def.node}
    server = f"/job:{SERVER_JOB}"
    clones: dict[tuple[str, str], str] = {}
    for node in list(graph_def.node):
        if not node.device.startswith(server):
            continue
        for i, inp in enumerate(node.input):
            name, _, port = inp.partition(":")
            source = None if inp.startswith("^") else nodes.get(name)
            if (source is None or source.op != "Const" or source.device.startswith(server)
                    or any(x.startswith("^") for x in source.input)
                    or source.attr["value"].ByteSize() > _SERVER_CONST_BYTES):
                continue
            key = (name, node.device)
            if key not in clones:
                clone = graph_def.node.add()
                clone.CopyFrom(source)
                clone.name = f"{name}/on_{'_'.join(filter(None, re.split(r'[^A-Za-z0-9]+', node.device)))}"
                clone.device = node.device
                nodes[clone.name] = clone
                clones[key] = clone.name
            node.input[i] = clones[key] + (f":{port}" if port else "")
    copies: dict[str, list[str]] = {}
    for (name, _), clone in sorted(clones.items()):
        copies.setdefault(f"{name}:0", []).append(f"{clone}:0")
    return copies


def _silence_dead_readers(graph_def, noops: set[str]) -> None:
    """A node reading a data output of an op made a NoOp (a server update on
    a worker that does not run it) would not import; when nothing reads it
    in turn (the Identity of an unused output of Keras's Adagrad's cond, a
    server update of its embedding), it becomes a NoOp after that op too."""
    readers = readers_of(graph_def)
    stack = sorted(noops)
    while stack:
        name = stack.pop()
        for node in readers.get(name, []):
            if node.name in noops or node.op == "NoOp" or readers.get(node.name):
                continue
            if any(not i.startswith("^") and op_name_of(i) == name for i in node.input):
                _make_noop(node)
                node.input.append("^" + name)
                noops.add(node.name)
                stack.append(node.name)


def _meta_graph(graph_or_meta) -> tf1.MetaGraphDef:
    """The input as a MetaGraphDef of our own (never the caller's object). A
    tf.Graph is exported with its devices (clearing them costs a copy of
    every node; _scratch_copy clears them in its own pass) and without
    inferred output shapes: TensorFlow's export adds an "_output_shapes"
    attribute to every node, which nothing reads (an import infers shapes
    again) and which made every original node of a worker's graph larger."""
    if isinstance(graph_or_meta, tf.Graph):
        with graph_or_meta.as_default():   # see graph_utils.meta_graph_of
            return tf1.train.export_meta_graph(
                graph=graph_or_meta, graph_def=graph_or_meta.as_graph_def(),
                clear_devices=False)
    meta = tf1.MetaGraphDef()
    meta.CopyFrom(meta_graph_of(graph_or_meta))
    return meta


def _export(meta: tf1.MetaGraphDef, scratch: tf.Graph, n_original: int):
    """The scratch graph as a GraphDef, and the names of its new nodes (those
    after the first `n_original`, the import of `meta`).

    The rewrite never changes an imported op in the scratch graph (its edits
    are NodeDef passes over this export), so the original nodes are `meta`'s,
    copied as one message, and only the new ops are exported one by one:
    TensorFlow's export of the whole graph serialises and parses every
    original node again (~0.2 s for a BERT-large graph). Whatever the import
    cleared (devices, colocation hints) the GraphDef passes set or drop on
    every node. The whole graph is exported when the scratch graph holds
    anything else than `meta`'s nodes and functions plus new ops."""
    ops = scratch.get_operations()
    new = ops[n_original:]
    original = meta.graph_def
    if (len(original.node) != n_original
            or len(scratch._functions) != len(original.library.function)):  # pylint: disable=protected-access
        return scratch.as_graph_def(), {op.name for op in new}
    graph_def = tf1.GraphDef()
    graph_def.CopyFrom(original)
    graph_def.node.extend(op.node_def for op in new)
    return graph_def, {op.name for op in new}


_NUMBERED = re.compile(r"_\d+$")


def _stable_function_names(graph_def, original: set[str]) -> None:
    """The functions the rewrite built (a feature's conds: TensorFlow ends
    their names with a count of the process's ops so far) named alike in
    every rewrite of one plan, whatever ran before it in the process: each
    its name without that count, then a digest of its body (functions the
    body calls renamed first), so that no two graphs of a process give one
    name to two bodies (a first version numbered them, and a script's two
    jobs then did; whether TensorFlow would run the first body for the
    second was not settled: unique names leave nothing to settle). The
    library sorted by name, which TensorFlow lists in its hash map's
    order."""
    library = graph_def.library.function
    built = {f.signature.name: f for f in library if f.signature.name not in original}
    if not built:
        return
    renamed: dict[str, str] = {}

    def rename(name: str, seen: frozenset) -> str:
        if name not in renamed:
            f = built[name]
            for func in function_calls(f.node_def):
                if func.name in built and func.name not in seen:
                    func.name = rename(func.name, seen | {name})
            body = type(f)()
            body.CopyFrom(f)
            body.signature.name = ""
            digest = hashlib.sha1(body.SerializeToString(deterministic=True)).hexdigest()[:16]
            renamed[name] = f"{_NUMBERED.sub('', name)}_{digest}"
        return renamed[name]

    for name in sorted(built):
        rename(name, frozenset())
    for func in function_calls(graph_def.node):
        func.name = renamed.get(func.name, func.name)
    for f in library:
        f.signature.name = renamed.get(f.signature.name, f.signature.name)
    # (two conds' branches of one body are one function)
    ordered = list({f.signature.name: f for f in sorted(
        library, key=lambda f: f.signature.name)}.values())
    del library[:]
    library.extend(ordered)


def _scratch_copy(meta: tf1.MetaGraphDef, collections: bool = True,
                  devices: bool = True) -> tf.Graph:
    """The graph of `meta` in a fresh tf.Graph, without devices (an op built
    next to one with a device would inherit it; _set_devices sets every
    node's); with its collections if asked (restoring them builds a Python
    Variable per variable: a third of the import's time for a large model).
    `devices`: whether any node may have a device (False: known to have
    none). Colocation hints are left to the import when nothing else is to
    clear: an op built under one only gets hints (never a device, the
    import's having none), and _set_devices drops every node's."""
    serialized = meta.graph_def.SerializeToString()
    graph_def = meta.graph_def
    if collections or devices:
        # A pass over every node (the first access to a GraphDef's nodes from
        # Python is what costs, ~15 us each), only when something is to clear.
        graph_def = tf1.GraphDef()
        graph_def.CopyFrom(meta.graph_def)
        for node in graph_def.node:
            node.device = ""
            if "_class" in node.attr:
                del node.attr["_class"]
        serialized = None
    graph = tf.Graph()
    with graph.as_default():
        if collections:
            stripped = tf1.MetaGraphDef()
            stripped.CopyFrom(meta)
            stripped.graph_def.CopyFrom(graph_def)
            import_meta_graph(stripped)
        else:
            import_nodes(graph_def, serialized)
    return graph


@dataclass
class _Variable:
    """What the state broadcast needs of a global variable (from the
    MetaGraphDef: no tf.Variable object needed)."""
    name: str           # its op
    dtype: tf.DType
    shape: list[int]
    resource: bool
    snapshot: str       # a ref variable's value (its "read" Identity)


def _global_variables(meta: tf1.MetaGraphDef, graph: tf.Graph) -> list[_Variable]:
    """The MetaGraphDef's global variables, in collection order (dtypes and
    shapes from their ops in `graph`, its import)."""
    from tensorflow.core.framework import variable_pb2
    out = []
    if tf1.GraphKeys.GLOBAL_VARIABLES not in meta.collection_def:
        return out   # (indexing the map would add an empty collection to `meta`)
    for raw in meta.collection_def[tf1.GraphKeys.GLOBAL_VARIABLES].bytes_list.value:
        proto = variable_pb2.VariableDef.FromString(raw)
        op = graph.get_operation_by_name(op_name_of(proto.variable_name))
        out.append(_Variable(op.name, tf.as_dtype(op.get_attr("dtype")).base_dtype,
                             tf.TensorShape(op.get_attr("shape")).as_list(), proto.is_resource,
                             op_name_of(proto.snapshot_name)))
    return out


def _with_graph_def(meta: tf1.MetaGraphDef, graph_def) -> tf1.MetaGraphDef:
    """`meta` with its GraphDef replaced. The collections stay valid: the
    rewrite adds no tf.Variable (partitions and counters are raw resource ops)
    and keeps every original node's name. Exporting the scratch graph instead
    would serialise every op once more for the same result."""
    from tensorflow.python.framework import meta_graph as tf_meta_graph
    out = tf1.MetaGraphDef()
    out.CopyFrom(meta)
    out.graph_def.CopyFrom(graph_def)
    out.meta_info_def.stripped_op_list.CopyFrom(tf_meta_graph.stripped_op_list_for_graph(graph_def))
    return out


def _make_identity(node, tensor: str) -> None:
    """Keep the node's name (fetches and checkpoints refer to it), compute `tensor`."""
    dtype = (tf.bool.as_datatype_enum if node.op == "VarIsInitializedOp"
             else node.attr["out_type"].type if node.op == "VariableShape"
             else node.attr["Tout"].list.type[0] if node.op in ("If", "StatelessIf")
             else node.attr["Tparams"].type if node.op == "GatherV2"
             else node.attr["dtype"].type)
    node.op = "Identity"
    del node.input[:]
    node.input.append(node_input_name(tensor))
    node.attr.clear()
    node.attr["T"].type = dtype


def _make_noop(node) -> None:
    """This worker does not run the op (the chief applies server updates);
    the caller gives it the control inputs what depended on it waits for."""
    node.op = "NoOp"
    del node.input[:]
    node.attr.clear()


def _broadcast_state(variables: list[_Variable], plan: Plan, backend, is_chief: bool,
                     skip: set[str]) -> list["_BroadcastGroup"]:
    """The collectives of an op that overwrites every replicated global
    variable with the chief's value, so replicas start identical however they
    were initialised (or restored). Variables on servers exist once and are
    skipped.

    Only the collectives (one per dtype, in one launch order) are built here,
    the chief's reading from a stand-in for the flat tensor of its values.
    The per-variable ops (the chief's reads and reshapes, a receiver's
    reshapes and assignments: a few per variable, thousands in a large model)
    are written as NodeDefs by _splice_broadcast: building them through
    TensorFlow's Python API cost ~1 ms each, a quarter of a rewrite."""
    by_dtype: dict[str, list[_Variable]] = {}   # as local_state._variables_by_dtype orders them
    for v in variables:
        if v.name not in skip:
            by_dtype.setdefault(v.dtype.name, []).append(v)
    groups = []
    with tf.name_scope("autopar/broadcast"):
        previous = []
        for i, dtype in enumerate(sorted(by_dtype)):
            group = by_dtype[dtype]
            size = sum(int(np.prod(v.shape, dtype=np.int64)) for v in group)
            with tf.control_dependencies(previous):
                stand_in = tf1.placeholder(group[0].dtype, [size], name="values")
                received = backend.broadcast(stand_in, plan.broadcast_key_base + i,
                                             is_source=is_chief)
            groups.append(_BroadcastGroup(group, stand_in.op.name, received.op.name,
                                          previous[0].op.name if previous else None))
            previous = [received]
    return groups


@dataclass
class _BroadcastGroup:
    variables: list[_Variable]
    stand_in: str        # placeholder the chief's collective reads (replaced by the values)
    collective: str
    after: str | None    # the previous group's collective: one launch order everywhere


def _splice_broadcast(graph_def, groups: list[_BroadcastGroup], is_chief: bool,
                      minus_one: str, device: str, by_name: dict | None = None) -> list[str]:
    """Write _broadcast_state's per-variable ops into `graph_def` and the
    BROADCAST_OP NoOp; return the new nodes' names. The chief concatenates its
    flattened values into each collective; a receiver splits what it receives
    and assigns each variable its piece (as transforms.local_state lays out
    its flat tensors). Nodes are the ones TensorFlow's API would build, minus the
    value read back after each assignment, which nothing consumes. `by_name`:
    an index of graph_def's nodes, kept up to date."""
    nodes = NodeWriter(graph_def, device, "autopar/broadcast/", by_name=by_name)
    int32 = tf.int32
    dims = []   # BROADCAST_OP's control inputs
    for g in groups:
        after = ["^" + g.after] if g.after else []
        dtype = g.variables[0].dtype
        if is_chief:
            pieces = []
            for v in g.variables:
                read = (nodes.add("ReadVariableOp", [v.name, *after], dtype=dtype) if v.resource
                        else v.snapshot)
                pieces.append(nodes.add("Reshape", [read, minus_one, *([] if v.resource else after)],
                                        T=dtype, Tshape=int32))
            if len(pieces) == 1:
                flat = nodes.add("Identity", pieces, T=dtype)
            else:
                axis = nodes.add_const(0, int32, after)
                flat = nodes.add("ConcatV2", [*pieces, axis], N=len(pieces), T=dtype, Tidx=int32)
            collective = nodes.by_name[g.collective]
            collective.input[:] = [flat if i == g.stand_in else i for i in collective.input]
        else:
            sizes = nodes.add_const([int(np.prod(v.shape, dtype=np.int64)) for v in g.variables],
                                    int32)
            split = nodes.add("SplitV", [g.collective, sizes, nodes.add_const(0, int32)],
                              T=dtype, Tlen=int32, num_split=len(g.variables))
            for k, v in enumerate(g.variables):
                piece = nodes.add("Reshape", [f"{split}:{k}" if k else split,
                                              nodes.shape_const(v.shape)], T=dtype, Tshape=int32)
                if v.resource:
                    assign = nodes.add("AssignVariableOp", [v.name, piece], dtype=dtype,
                                       validate_shape=True)
                else:
                    assign = nodes.add("Assign", [v.name, piece], T=dtype, use_locking=True,
                                       validate_shape=True)
                dims.append("^" + assign)
        nodes.remove(g.stand_in)
    if groups:
        dims.append("^" + groups[-1].collective)
    noop = graph_def.node.add(name=BROADCAST_OP, op="NoOp", device=device)
    noop.input.extend(dims)
    return nodes.added + [BROADCAST_OP]
