"""A traced TensorFlow 2 function as an ordinary tf.compat.v1 graph.

A `tf.function` training step traced to a ConcreteFunction is a FuncGraph:
its inputs are the fed tensors plus one resource Placeholder per captured
variable (`func_graph.captures` pairs each eager handle with the Placeholder
standing for it), and a Keras optimizer's updates are assign ops on those
Placeholders (shared/notes/tf2-graphs.md). Lifting imports its GraphDef into
a fresh tf.Graph in which every captured variable is a resource variable of
the same name, shape, dtype and trainability, each Placeholder mapped to that
variable's handle, and every fed input keeps its name, so tensors of the
FuncGraph (`cf.graph.inputs`, `cf.graph.outputs`) name tensors of the lifted
graph. The result is what the analysis and the rewrite take from a
tf.compat.v1 program.

A lifted variable's initial value is a placeholder with a default of zeros
(`LiftedGraph.initial_values`): the Runner feeds the Python variable's
current value when it initialises (values are not copied into the GraphDef,
which would hold every weight twice), and writes the trained values back to
the Python variables (`LiftedGraph.python_variables`) so that the Keras
model and optimizer hold them.

A session cannot use an eager summary writer: the function's writes to a
captured writer are taken out of the graph (`LiftedGraph.summaries`), and
Runner.call fetches what each reads and writes it to the Python writer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx
from tensorflow.python.ops import handle_data_util   # the dtype and shape a handle holds
import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.graph_utils import in_gradient_scope, op_digraph, op_name_of
from autopar.transforms.lower_cond import lower_conds

tf1 = tf.compat.v1

# The graph collection naming the ops a run of the lifted function fetches:
# its outputs and CALL_OP. These are the only ops a user runs as a step, so
# the analysis's train groups come from them alone (analysis._train_groups:
# inside the function TensorFlow chains every stateful op in program order,
# and an op in the middle of that chain is no train op of the program).
FETCHES = "autopar_function_fetches"
# A NoOp waiting for the function's control outputs (its stateful ops: the
# variable updates); Runner.call fetches it beside the outputs.
CALL_OP = "autopar/function_call"
# The graph collection pairing each tape's seed with the loss it
# differentiates, "<seed op>|<loss tensor>" (tape_seed_pairs): a tape names
# neither, where tf.gradients' scope names both (analysis._loss_seeds).
TAPE_SEEDS = "autopar_tape_seeds"


@dataclass
class LiftedGraph:
    graph: tf.Graph
    # lifted variable (op name) -> the Python variable it stands for
    python_variables: dict = field(default_factory=dict)
    # the placeholder of each lifted variable's initial value -> its Python variable
    initial_values: dict = field(default_factory=dict)
    # When lifted from a ConcreteFunction (for Runner.call): the names of
    # the tensors its arguments feed, in order, and its outputs as it
    # returns them (each tensor one of the lifted graph's, or the traced
    # graph's of the same name); None from a FuncGraph alone.
    inputs: list[str] | None = None
    outputs: object = None
    # the function's writes to captured summary writers, taken out of the
    # graph: Runner.call fetches their inputs and the chief writes them
    summaries: list["SummaryWrite"] = field(default_factory=list)
    # tensor name -> the static shape (a list; None for an unknown
    # dimension) tracing inferred and importing did not (_with_traced_shapes):
    # a graph imported elsewhere gets them again (transforms.portable_step)
    traced_shapes: dict = field(default_factory=dict)

    def initial_feed(self) -> dict:
        """{initial-value placeholder name: the Python variable's value now}."""
        return {name: var.numpy() for name, var in self.initial_values.items()}


# The ops that use a tf.summary writer resource.
SUMMARY_WRITES = frozenset({"WriteSummary", "WriteScalarSummary", "WriteHistogramSummary",
                            "WriteImageSummary", "WriteAudioSummary", "WriteRawProtoSummary",
                            "WriteGraphSummary"})
_SUMMARY_OPS = SUMMARY_WRITES | {"FlushSummaryWriter"}


@dataclass
class SummaryWrite:
    """One of a traced function's summary ops on a captured writer, out of
    the lifted graph: `op` its type, `inputs` the lifted graph's tensors it
    reads besides the writer (none for a flush), `args` their argument names
    (tf.raw_ops takes keywords), `writer` the eager handle."""
    op: str
    inputs: list[str]
    args: list[str]
    writer: object

    def write(self, values: list) -> None:
        """Run the op eagerly on the Python writer with `values` of its inputs."""
        getattr(tf.raw_ops, self.op)(writer=self.writer, **dict(zip(self.args, values)))


def is_traced(obj) -> bool:
    """Whether `obj` is a traced function graph or a ConcreteFunction."""
    return _func_graph(obj) is not None


def _func_graph(obj):
    from tensorflow.python.framework.func_graph import FuncGraph
    if isinstance(obj, FuncGraph):
        return obj
    graph = getattr(obj, "graph", None)
    if isinstance(graph, FuncGraph) and hasattr(obj, "structured_outputs"):
        return graph
    return None


def lift(obj) -> LiftedGraph:
    """The tf.compat.v1 graph of a FuncGraph or ConcreteFunction (module docstring)."""
    func_graph = _func_graph(obj)
    if func_graph is None:
        raise TypeError(f"not a traced function: {obj!r}")
    _check_inputs(func_graph)
    by_handle = {id(v.handle): v for v in func_graph.variables}
    graph_def = lower_conds(_with_function_shapes(func_graph))
    _outputs_after_nothing(graph_def, {t.op.name for t in func_graph.outputs})
    taken = (_name_prefixes(graph_def), {node.name for node in graph_def.node})
    lifted = LiftedGraph(tf.Graph())
    if obj is not func_graph:
        fed = len(func_graph.inputs) - len(func_graph.captures)
        lifted.inputs = [t.name for t in func_graph.inputs[:fed]]
        lifted.outputs = obj.structured_outputs
    input_map = {}
    writers = {internal.name: external for external, internal in func_graph.captures
               if id(external) not in by_handle and external.dtype == tf.resource
               and internal.consumers()
               and all(c.type in _SUMMARY_OPS for c in internal.consumers())}
    summary_ops = _summary_ops(func_graph, writers)
    lifted.summaries = _take_summaries(graph_def, summary_ops, writers)
    tables = {internal.name: _table_contents(external, internal)
              for external, internal in func_graph.captures
              if id(external) not in by_handle and external.dtype == tf.resource
              and internal.name not in writers}
    with lifted.graph.as_default():
        for external, internal in func_graph.captures:
            variable = by_handle.get(id(external))
            if variable is None:
                if internal.name in writers:
                    continue   # its ops are out of the graph (_take_summaries)
                if tables.get(internal.name) is not None:
                    input_map[internal.name] = _lifted_table(internal, *tables[internal.name])
                    continue
                held = _captured_variable(external, internal)
                if held is not None:
                    # a variable the function does not list (a tf.compat.v1
                    # optimizer's slot, made outside it): lifted through its handle
                    input_map[internal.name] = _lifted_variable(held, taken, lifted).handle
                    continue
                if external.dtype == tf.resource:
                    raise UnsupportedGraphError(
                        f"the traced function captures the resource '{internal.op.name}', "
                        "which is not a tf.Variable (a lookup table, an iterator, a dataset, "
                        "a summary writer used inside a condition such as tf.summary.record_if?): "
                        "autopar can lift only variables, constants, tables it reads and summary "
                        "writers it writes to unconditionally; create that resource inside the "
                        "function or feed its values")
                value = external.numpy() if hasattr(external, "numpy") else None
                if value is None:
                    raise UnsupportedGraphError(
                        f"the traced function captures '{internal.op.name}', which is neither "
                        "a variable nor a constant")
                input_map[internal.name] = tf.constant(value, name=_outside(internal.op.name))
                continue
            input_map[internal.name] = _lifted_variable(variable, taken, lifted).handle
        tf1.import_graph_def(graph_def, input_map=input_map, name="")
        lifted.traced_shapes = _with_traced_shapes(lifted.graph, func_graph)
        taken_out = {op.name for op in summary_ops}
        ran = [lifted.graph.get_operation_by_name(op.name) for op in
               [t.op for t in func_graph.outputs] + list(func_graph.control_outputs)
               if op.name not in taken_out]
        for op in ran[:len(func_graph.outputs)]:
            tf1.add_to_collection(FETCHES, op)
        with tf1.name_scope(None):
            # The function's stateful ops only: Runner.call fetches the
            # outputs beside it, and with micro-batches the update's run
            # reads no input (the outputs come from the micro-batch runs).
            tf1.add_to_collection(FETCHES, tf.group(*ran[len(func_graph.outputs):], name=CALL_OP))
        targets: dict[str, tf.Tensor] = {}
        for seed, target in _loss_outputs(func_graph):
            loss = targets.get(target.name)
            if loss is None:
                loss = lifted.graph.get_tensor_by_name(target.name)
                if loss.shape.rank:
                    # a tape differentiates a tensor as the sum of its elements
                    loss = tf.reduce_sum(loss, name=f"{loss.op.name}/autopar_tape_target_sum")
                tf1.add_to_collection(tf1.GraphKeys.LOSSES, loss)
                targets[target.name] = loss
            tf1.add_to_collection(TAPE_SEEDS, f"{seed.name}|{loss.name}")
    for op in func_graph.get_operations():
        if op.type != "Placeholder" or op.outputs[0].name in input_map:
            continue
        if lifted.graph.get_operation_by_name(op.name).type != "Placeholder":
            raise UnsupportedGraphError(f"lifting the traced function renamed its input "
                                        f"'{op.name}': a variable's name collides with it")
    return lifted


def _with_function_shapes(func_graph):
    """The traced graph's GraphDef, whose library functions (a While's
    body, a cond's branches: an RNN's step, a Keras layer's training
    switch) keep the shapes tracing inferred, as "_input_shapes", their
    resource arguments' handle data and each node's "_output_shapes": a
    function read back from a FunctionDef without them has no shape but its
    arguments' (every variable read unknown), which the analyses of data
    flow cannot see through (transforms.example_rows: a bias of unknown rank
    added to an example's rows). Top-level nodes get shapes again when
    imported, so theirs are not kept."""
    graph_def = func_graph.as_graph_def(add_shapes=True)
    for node in graph_def.node:
        node.attr.pop("_output_shapes", None)
    return graph_def


def _with_traced_shapes(graph: tf.Graph, func_graph) -> dict:
    """Give each imported tensor the static shape tracing inferred for it
    where importing inferred less: an op whose shape function reads its
    resource's handle data (a lookup in a table lifted as a new one, as
    Keras's IntegerLookup and StringLookup read theirs) has an output of
    unknown rank after the import, which the analyses of data flow cannot
    see through (transforms.example_rows: the shape of a lookup's one-hot
    encoding taken for no example's). Returns {tensor name: shape set}."""
    given = {}
    for op in func_graph.get_operations():
        try:
            lifted = graph.get_operation_by_name(op.name)
        except KeyError:
            continue   # taken out of the graph (a summary write)
        if lifted.type != op.type or len(lifted.outputs) != len(op.outputs):
            continue   # a captured placeholder, lifted as a variable or constant
        for mine, traced in zip(lifted.outputs, op.outputs):
            if mine.shape.is_fully_defined() or not mine.shape.is_compatible_with(traced.shape):
                continue
            mine.set_shape(traced.shape)   # (merged with what the import inferred)
            given[mine.name] = mine.shape.as_list() if mine.shape.rank is not None else None
    return given


def _check_inputs(func_graph) -> None:
    """Refuse an argument a session cannot feed: an iterator, a dataset, a
    variable passed to the function rather than captured by it (a resource
    or variant tensor), naming it."""
    captured = {internal.name for _, internal in func_graph.captures}
    for t in func_graph.inputs:
        if t.name not in captured and t.dtype in (tf.resource, tf.variant):
            raise UnsupportedGraphError(
                f"the traced function takes '{t.op.name}' ({t.dtype.name}: an iterator, a "
                "dataset, or a variable passed as an argument), which a session cannot be "
                "fed: take the batch from the iterator in Python and pass its tensors "
                "(runner.call(x, y) for step(x, y)), and use a variable by capture, not as an "
                "argument")


def _summary_ops(func_graph, writers: dict) -> list:
    """The function's ops on the captured summary writers `writers`, in the
    function's order."""
    return sorted((c for name in writers for c in func_graph.get_tensor_by_name(name).consumers()),
                  key=lambda op: op._id)  # pylint: disable=protected-access


def _take_summaries(graph_def, ops: list, writers: dict) -> list[SummaryWrite]:
    """Take the function's summary ops `ops` on the captured writers
    `writers` out of `graph_def` (and every control edge to them: TensorFlow
    orders a function's stateful ops, and nothing else waits for a summary).
    A lifted graph runs in a session, which cannot use an eager writer;
    Runner.call fetches what each write reads and writes it to the Python
    writer itself."""
    if not ops:
        return []
    names = {op.name for op in ops}
    kept = [node for node in graph_def.node if node.name not in names]
    for node in kept:
        inputs = [i for i in node.input if not (i.startswith("^") and i[1:] in names)]
        del node.input[:]
        node.input.extend(inputs)
    del graph_def.node[:]
    graph_def.node.extend(kept)
    return [SummaryWrite(op.type, [x.name for x in op.inputs[1:]],
                         [a.name for a in op.op_def.input_arg[1:]], writers[op.inputs[0].name])
            for op in ops]


def _outputs_after_nothing(graph_def, outputs: set[str]) -> None:
    """Drop the control inputs of the function's output Identities. A
    tf.function makes each output wait for every stateful op, so that a
    call returns after its updates; in the lifted graph CALL_OP stands for
    those (Runner.call fetches it with the outputs), and an output that
    waited for the updates would make them steps of their own: fetched
    alone it would train, and with micro-batches the update's run would
    compute the forward pass once more for it."""
    for node in graph_def.node:
        if node.name in outputs and node.op == "Identity":
            kept = [i for i in node.input if not i.startswith("^")]
            del node.input[:]
            node.input.extend(kept)


def tape_seed_pairs(graph) -> list[tuple[str, str]]:
    """(seed op, loss tensor) of each tape of a lifted function (TAPE_SEEDS)."""
    return [tuple((entry.decode() if isinstance(entry, bytes) else entry).split("|", 1))
            for entry in graph.get_collection(TAPE_SEEDS)]


def _loss_outputs(func_graph) -> list:
    """(seed, target) of each GradientTape's gradient() call: the tensor
    it differentiates, found from the tape's backward pass, whatever the
    function returns; without a tape (tf.gradients, whose seeds the
    analysis reads itself) none."""
    ops = func_graph.get_operations()
    seeds = _tape_seeds(ops)
    if not seeds:
        return []
    position = {op.name: i for i, op in enumerate(ops)}
    digraph = op_digraph(func_graph)
    forward = digraph.subgraph(name for name in digraph if not in_gradient_scope(name))
    # a target the function returns is named as returned
    returned = {}
    for t in func_graph.outputs:
        inner = t
        while inner.op.type == "Identity" and inner.op.inputs:
            inner = inner.op.inputs[0]
        returned.setdefault(inner.name, t)
    out = []
    for seed in seeds:
        target = _tape_target(seed, position, digraph, forward)
        if target is not None:
            out.append((seed, returned.get(target.name, target)))
    return out


def _tape_seeds(ops) -> list:
    """The initial gradients of the tapes' gradient() calls: the ones that
    GradientTape.gradient makes of its target's shape (a Const `ones` for a
    scalar, a Fill `ones_like` for a tensor) and only the backward pass
    reads."""
    return [op for op in ops
            if op.type in ("Const", "Fill") and op.name.rsplit("/", 1)[-1].startswith("ones")
            and not in_gradient_scope(op.name) and op.outputs[0].shape.rank is not None
            and op.outputs[0].dtype.is_floating and op.outputs[0].consumers()
            and all(in_gradient_scope(c.name) for c in op.outputs[0].consumers())]


def _tape_target(seed, position: dict, digraph, forward):
    """The tensor a tape's gradient() started from `seed` differentiates
    (`digraph`: the function's ops, graph_utils.op_digraph; `forward`: its
    ops outside the backward pass). Its backward pass reads forward tensors
    (a MatMul's inputs, a Relu's output, a shape) only of ops that tensor is
    computed from, so it is the first floating tensor of the seed's rank,
    in the graph's (topological) order, computed from every forward op the
    backward pass reads: a loss, not a value computed from it afterwards (a
    metric's update). None if no such tensor."""
    # The backward pass: the ops computed from the seed, and the gradient
    # ops they read beside it (a Square's gradient multiplies by 2x apart).
    reads, seen, stack = set(), {seed.name}, [seed]
    while stack:
        op = stack.pop()
        linked = [c for t in op.outputs for c in t.consumers()] + [x.op for x in op.inputs]
        for other in linked:
            if other.name not in seen and in_gradient_scope(other.name):
                seen.add(other.name)
                stack.append(other)
        if op is not seed:
            # constants too: a term scaled by one (1e-2 * reduce_sum(x), an
            # activity regularizer's add_loss) may read nothing else, and
            # whatever forward tensor the backward pass reads is an input
            # or output of an op the target is computed from
            reads |= {_shaped(x).op.name for x in op.inputs if not in_gradient_scope(x.op.name)
                      and x.op is not seed}
    # a constant made after gradient() began, outside its scope, is of no
    # target: the zeros a While's gradient makes for an output of static
    # shape the loss does not use (a tf.scan's last carry)
    graph = seed.graph
    reads = {name for name in reads if position[name] < position[seed.name]
             or graph.get_operation_by_name(name).type != "Const"}
    if not reads:
        return None
    latest = max(reads, key=position.__getitem__)
    rank = seed.outputs[0].shape.rank
    for name in sorted(nx.descendants(forward, latest) | {latest}, key=position.__getitem__):
        op = graph.get_operation_by_name(name)
        alike = [t for t in op.outputs if t.dtype.is_floating and t.shape.rank == rank]
        # A read output of an op whose gradient reads only its inputs is an
        # input of an op differentiated after it: not the target (Keras's
        # Tversky loss divides its intersection by a sum, whose gradient
        # reads that sum, computed from every other read)
        if alike and reads <= nx.ancestors(digraph, name) | {name} \
                and not (name in reads and op.type in _GRADIENT_READS_INPUTS_ONLY):
            return _with_unread_terms(alike[0], reads, position[seed.name], digraph, forward)
    return None


# Ops whose gradient reads their inputs (or nothing), never their output.
_GRADIENT_READS_INPUTS_ONLY = frozenset("""Add AddV2 AddN Sub Neg Mul MulNoNan Div RealDiv
DivNoNan Sum Mean MatMul BatchMatMulV2 BiasAdd Cast Identity Reshape Square SquaredDifference
ConcatV2 Pack Maximum Minimum Abs Log Log1p Squeeze ExpandDims""".split())


# Ops that add a loss's terms.
_ADDING = frozenset({"Add", "AddV2", "AddN", "Sub"})
# Ops whose gradient need read none of their inputs or outputs when shapes
# are static (a sum's is its incoming gradient tiled, a reshape's reshaped).
_READ_FREE = frozenset({"Add", "AddV2", "AddN", "Sub", "Neg", "Identity", "Cast", "Reshape",
                        "Sum", "Mean", "ConcatV2", "Pack", "ExpandDims", "Squeeze", "Snapshot",
                        "StopGradient", "IdentityN", "Tile", "BroadcastTo", "Transpose",
                        "StridedSlice", "Slice", "Pad", "Const", "ReadVariableOp",
                        "ResourceGather", "GatherV2", "Placeholder", "Fill", "ZerosLike",
                        "OnesLike", "Shape", "ShapeN", "Size", "Rank", "Range"})


def _with_unread_terms(target, reads: set, seed_position: int, digraph, forward):
    """`target` with the terms added to it before the tape's gradient()
    call whose backward passes read no forward tensor (a regularizer's
    reduce_sum of activations of static shape, its scale a constant): a
    tensor of the seed's rank made by adding a term to `target` (created
    before the seed) is the target instead when every op of the term that
    is not the target's has a gradient reading nothing or reading one of
    its inputs or outputs the backward pass does read. A term computed
    otherwise (another tape's loss, added up for a log) has ops whose
    gradients would read what this backward pass does not."""
    graph = target.graph
    position = {op.name: i for i, op in enumerate(graph.get_operations())}
    while True:
        mine = nx.ancestors(digraph, target.op.name) | {target.op.name}
        grown = []
        for op in {c for c in target.consumers()}:
            if (op.type not in _ADDING or op.name not in forward
                    or position[op.name] > seed_position or len(op.outputs) != 1
                    or op.outputs[0].shape.rank != target.shape.rank
                    or not op.outputs[0].dtype.is_floating):
                continue
            terms = (nx.ancestors(forward, op.name) | {op.name}) - mine - {op.name}
            if all(_differentiated_alike(graph.get_operation_by_name(n), reads) for n in terms):
                grown.append(op.outputs[0])
        if len(grown) != 1:
            return target
        target = grown[0]


def _differentiated_alike(op, reads: set) -> bool:
    """Whether a backward pass reading `reads` may have differentiated `op`:
    its gradient needs no forward tensor, or reads one of its own."""
    if op.type in _READ_FREE or not any(t.dtype.is_floating for t in op.outputs):
        return True
    return (any(x.op.name in reads for x in op.inputs)
            or op.name in reads)


def _shaped(t):
    """What a forward tensor the backward pass reads is computed from when
    only its shape counts: a While's gradient reads zeros_like(output) for
    each output the loss does not use, built outside the tape's scope; the
    output's op is the loss's ancestor, its zeros are not."""
    while t.op.type in ("ZerosLike", "OnesLike", "Shape", "ShapeN", "Size", "Rank") \
            and t.op.inputs and not in_gradient_scope(t.op.inputs[0].op.name):
        t = t.op.inputs[0]
    return t


class CapturedVariable:
    """A variable a traced function captures by its handle alone, no Python
    tf.Variable of the function's standing for it (a tf.compat.v1
    optimizer's slot, which the optimizer makes outside the function):
    what the runner reads and writes of a Python variable (`numpy`,
    `assign`, `shape`, `dtype`, `trainable`, `name`), done through the
    handle eagerly."""

    def __init__(self, handle, name: str, dtype: tf.DType, shape: tf.TensorShape) -> None:
        self.handle, self.name, self.dtype, self.shape = handle, name, dtype, shape
        self.trainable = False

    def numpy(self):
        return tf.raw_ops.ReadVariableOp(resource=self.handle, dtype=self.dtype).numpy()

    def assign(self, value) -> None:
        tf.raw_ops.AssignVariableOp(resource=self.handle,
                                    value=tf.convert_to_tensor(value, self.dtype))


def _captured_variable(external, internal) -> CapturedVariable | None:
    """The variable behind a captured eager resource handle whose handle
    data says it holds a tensor of one dtype and shape (a lookup table's
    says nothing), else None."""
    if external.dtype != tf.resource or not hasattr(external, "numpy"):
        return None
    data = handle_data_util.get_resource_handle_data(internal)
    if not data.is_set or len(data.shape_and_type) != 1:
        return None
    held = data.shape_and_type[0]
    return CapturedVariable(external, f"{_outside(internal.op.name)}:0",
                            tf.as_dtype(held.dtype), tf.TensorShape(held.shape))


def _lifted_variable(variable, taken: tuple[set[str], set[str]], lifted: LiftedGraph):
    """A resource variable standing for the Python `variable` in the
    default graph, named like it unless the traced graph uses that name.
    `taken`: the traced graph's names and scopes, and its ops' names."""
    name = _free_name(op_name_of(variable.name), *taken)
    shape, dtype = variable.shape, variable.dtype.base_dtype
    if not shape.is_fully_defined():
        raise UnsupportedGraphError(f"variable '{name}' has no fully defined shape ({shape}): "
                                    "autopar needs every variable's shape")
    made = []

    def initial_value():   # built inside the variable's Initializer scope
        made.append(tf1.placeholder_with_default(tf.zeros(shape, dtype), shape,
                                                 name="initial_value"))
        return made[0]

    with tf1.name_scope(None):
        lifted_var = tf1.Variable(initial_value, name=name, trainable=variable.trainable,
                                  dtype=dtype, use_resource=True)
    lifted.python_variables[lifted_var.op.name] = variable
    lifted.initial_values[made[0].name] = variable
    return lifted_var


def _free_name(name: str, scopes: set[str], ops: set[str]) -> str:
    """`name`, or it with "_var" added where it meets the traced graph's
    names: no name or scope of the graph is `name`, and no op of it is
    named like a scope `name` lies in (TensorFlow marks a new op's scopes as
    used, and importing the graph would then rename that op: a variable a
    Keras layer made inside a tf.while_loop is "while/dense/kernel", beside
    the loop's op "while")."""
    parts = name.split("/")
    k = 0
    while k < len(parts):
        here = "/".join(parts[:k + 1])
        if here in ops or (k == len(parts) - 1 and here in scopes):
            parts[k] += "_var"
        else:
            k += 1
    return "/".join(parts)


# Ops that only read a lookup table.
_TABLE_READS = frozenset({"LookupTableFindV2", "LookupTableSizeV2"})


def _table_contents(external, internal):
    """(key dtype, value dtype, keys, values) of a captured lookup table the
    function only reads (a Keras StringLookup's or IntegerLookup's
    vocabulary: a tf.lookup.StaticHashTable), read now; None for any other
    resource."""
    readers = set(internal.consumers())
    finds = [op for op in readers if op.type == "LookupTableFindV2"]
    if not finds or any(op.type not in _TABLE_READS for op in readers):
        return None
    key_dtype, value_dtype = finds[0].get_attr("Tin"), finds[0].get_attr("Tout")
    try:
        keys, values = tf.raw_ops.LookupTableExportV2(table_handle=external, Tkeys=key_dtype,
                                                      Tvalues=value_dtype)
    except (tf.errors.OpError, TypeError, ValueError):
        return None
    return key_dtype, value_dtype, keys.numpy(), values.numpy()


def _lifted_table(internal, key_dtype, value_dtype, keys, values):
    """A HashTable of the lifted graph holding a captured table's keys and
    values, filled by its initializer (tf.compat.v1.tables_initializer,
    which every process runs at start)."""
    with tf1.name_scope(None):
        name = _outside(internal.op.name)
        table = tf.raw_ops.HashTableV2(key_dtype=key_dtype, value_dtype=value_dtype,
                                       shared_name=name, name=name)
        tf1.add_to_collection(tf1.GraphKeys.TABLE_INITIALIZERS, tf.raw_ops.InitializeTableV2(
            table_handle=table, keys=tf.constant(keys, key_dtype),
            values=tf.constant(values, value_dtype), name=name + "/init"))
    return table


def _outside(name: str) -> str:
    """A name for a lifted capture outside every name of the traced
    function: an op under one of its op's names would make the import
    rename that op (a captured constant named 'lookup/default_value_value'
    renamed the table lookup 'lookup' to 'lookup_1')."""
    return "autopar_lifted/" + name.replace("/", "_")


def _name_prefixes(graph_def) -> set[str]:
    """Every op name of `graph_def` and every scope it lies in."""
    out = set()
    for node in graph_def.node:
        parts = node.name.split("/")
        for k in range(1, len(parts) + 1):
            out.add("/".join(parts[:k]))
    return out
