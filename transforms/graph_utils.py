"""Small helpers on TensorFlow graphs shared by analysis, plan and rewrite.

Kept in one place so every transform agrees on what a "gradient op", a
"variable op" or a tensor name is.
"""
from __future__ import annotations

import contextlib
import gc
import re

import networkx as nx
import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

# tf.gradients puts everything it builds under a name scope called
# "gradients" (or "gradients_1", ... when several exist), possibly nested in a
# user scope. That scope is the only reliable marker of the backward pass in a
# GraphDef, so the boundary between "computing gradients" and "using them" is
# drawn there.
# The scopes TensorFlow builds a backward pass in: tf.gradients' "gradients"
# (tf.compat.v1 optimizers) and a GradientTape's "gradient_tape" (in a
# traced tf.function), each maybe uniquified ("gradients_1").
_GRAD_SCOPE = re.compile(r"^(gradients|gradient_tape)(_\d+)?$")

VARIABLE_OP_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable"})
# Ops whose value is a tensor's shape alone.
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})
# What reads a variable's value (a lifted step's captured handle is read by
# ReadVariableOp).
_VARIABLE_READS = VARIABLE_OP_TYPES | {"ReadVariableOp", "ResourceGather"}
# Ops whose value depends on their input's shape alone (a count of a loss's
# elements: tf.compat.v1.losses' num_present, from ones_like(losses)).
OF_SHAPES_ALONE = SHAPE_OPS | {"OnesLike", "ZerosLike"}

_WRITE_OPS = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                        "Assign", "AssignAdd", "AssignSub", "ResourceScatterAdd", "ScatterAdd"})
# Fused optimizer updates and scatters write the variable of their first input.
_WRITE_PREFIXES = ("ResourceApply", "ResourceSparseApply", "ResourceScatter", "Apply",
                   "SparseApply", "Scatter")


def writes_variable(op_type: str) -> bool:
    """Whether ops of `op_type` write the variable of their first input."""
    return op_type in _WRITE_OPS or op_type.startswith(_WRITE_PREFIXES)


_GUARD_PREDICATES = frozenset({"IsVariableInitialized", "VarIsInitializedOp"})


def initialization_guard(op: tf.Operation) -> tf.Operation | None:
    """The variable op `op` guards, if `op` is TensorFlow's guard of an
    initial value reading another variable: cond(is_initialized(v), v, v's
    initial value), an If whose predicate asks whether its second input is
    initialised (inputs: predicate, v, initial value); else None."""
    if op.type not in ("If", "StatelessIf") or len(op.inputs) != 3 or len(op.outputs) != 1:
        return None
    pred, var, _ = op.inputs
    if pred.op.type in _GUARD_PREDICATES and pred.op.inputs and pred.op.inputs[0].op is var.op:
        return var.op
    return None


def initialization_stages(variables) -> list[list]:
    """`variables` in stages to initialise one after the other: a variable
    whose initial value reads another one through an initialization_guard
    (an ExponentialMovingAverage shadow) comes in a stage after it. Run
    together, the guard's predicate races the other's initialisation, and a
    reference variable's value is read before the predicate is known
    ("Attempting to use uninitialized value"). Stages keep the order of
    `variables`; a cycle (or a variable outside `variables`) adds no wait."""
    names = {v.op.name for v in variables}
    needs: dict[str, set[str]] = {}
    for v in variables:
        seen, stack, deps = set(), [v.initializer], set()
        while stack:
            op = stack.pop()
            if op.name in seen:
                continue
            seen.add(op.name)
            guarded = initialization_guard(op)
            if guarded is not None and guarded.name in names and guarded.name != v.op.name:
                deps.add(guarded.name)
            stack.extend(t.op for t in op.inputs if t.op.type not in VARIABLE_OP_TYPES)
        needs[v.op.name] = deps
    stages, done, left = [], set(), list(variables)
    while left:
        ready = [v for v in left if needs[v.op.name] <= done]
        if not ready:
            ready = left   # a cycle: no order helps
        stages.append(ready)
        done |= {v.op.name for v in ready}
        left = [v for v in left if v.op.name not in done]
    return stages


def staged_initializers(variables, extra=()) -> list:
    """The ops that initialise `variables` and run `extra`, one run each in
    order (initialization_stages: a variable whose initial value reads
    another is initialised after it), in the default graph."""
    stages = initialization_stages(variables) or [[]]
    ops = [tf1.variables_initializer(stage) for stage in stages]
    ops[-1] = tf.group(ops[-1], *extra)
    return ops


# Ops that bring a worker's own input batch into the graph.
INPUT_OP_TYPES = frozenset({
    "Placeholder", "PlaceholderWithDefault", "PlaceholderV2", "IteratorGetNext",
    "IteratorGetNextSync", "OptionalGetValue", "QueueDequeueV2", "QueueDequeueManyV2",
    "QueueDequeueUpToV2", "QueueDequeue", "QueueDequeueMany", "QueueDequeueUpTo"})


def batch_local_ops(graph, stops: set[str]) -> set[str]:
    """Ops whose inputs depend on this worker's own input batch other than
    through the tensors `stops` (the analysis's: the gradient tensors the
    rewrite replaces by their aggregate). Forward from the input ops along
    data edges, never crossing a stop."""
    frontier = [op for op in graph.get_operations() if op.type in INPUT_OP_TYPES]
    seen = {op.name for op in frontier}
    while frontier:
        op = frontier.pop()
        for t in op.outputs:
            if t.name in stops:
                continue
            for c in t.consumers():
                if c.name not in seen:
                    seen.add(c.name)
                    frontier.append(c)
    return seen


def in_gradient_scope(op_name: str) -> bool:
    if "gradient" not in op_name:   # the common case, without splitting the name
        return False
    return any(_GRAD_SCOPE.match(part) for part in op_name.split("/")[:-1])


@contextlib.contextmanager
def transforming():
    """The state the transforms run in, as it was after the block.

    - Python's cyclic garbage collector off. The analysis and the rewrite
      allocate tens of thousands of small objects (lists, sets, NodeDef
      wrappers, Operations); each full pass of the collector they would
      trigger walks every live object, the user's TensorFlow graph included
      (hundreds of thousands for a BERT-large graph), which made their time
      grow faster than the op count and vary by up to half a second from run
      to run with where the passes fell. The garbage they leave is collected
      once afterwards.
    - TensorFlow 2's static shapes: `shape[i]` an int or None. A program
      that called tf.compat.v1.disable_v2_behavior() gets V1 shapes, whose
      elements are `Dimension` objects: unhashable, and never `is None`, so
      every test of a dimension would silently mean something else
      (_v2_tensor_shapes)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        with _v2_tensor_shapes():
            yield
    finally:
        if enabled:
            gc.enable()


@contextlib.contextmanager
def _v2_tensor_shapes():
    """TensorShape indexing as under TensorFlow 2 for the block, then as it
    was. tf.compat.v1.enable_v2_tensorshape() is public, but puts back no
    earlier state: the override it sets (None: follow tf2.enabled()) is
    read and restored here, the one place autopar touches it."""
    from tensorflow.python.framework import tensor_shape  # pylint: disable=import-outside-toplevel
    before = tensor_shape._TENSORSHAPE_V2_OVERRIDE  # pylint: disable=protected-access
    tf1.enable_v2_tensorshape()
    try:
        yield
    finally:
        tensor_shape._TENSORSHAPE_V2_OVERRIDE = before  # pylint: disable=protected-access


def graph_of(graph_or_meta) -> tf.Graph:
    """A tf.Graph for a tf.Graph or a MetaGraphDef (imported into a fresh graph)."""
    if isinstance(graph_or_meta, tf.Graph):
        return graph_or_meta
    if isinstance(graph_or_meta, tf1.MetaGraphDef):
        graph = tf.Graph()
        with graph.as_default():
            import_meta_graph(graph_or_meta, clear_devices=True)
        return graph
    raise TypeError(f"expected a tf.Graph or MetaGraphDef, got {type(graph_or_meta).__name__}")


def import_meta_graph(meta: tf1.MetaGraphDef, clear_devices: bool = False) -> None:
    """Import `meta`'s graph and collections into the default graph.

    TensorFlow's public import (tf1.train.import_meta_graph) also builds a
    default Saver when the MetaGraphDef has none: a second import's worth of
    time (seconds for a BERT-large graph) and ~2 save/restore ops per variable
    that nobody runs (autopar checkpoints with its own ops, runtime.checkpoint).
    The scoped import it wraps does the same minus the Saver; it is private
    API, used here only."""
    from tensorflow.python.framework import meta_graph as tf_meta_graph
    tf_meta_graph.import_scoped_meta_graph(meta, clear_devices=clear_devices)


def import_nodes(graph_def, serialized: bytes | None = None) -> None:
    """Import `graph_def`'s nodes (and function library) into the default
    graph (`serialized`: graph_def's bytes, when the caller has them), as
    they are: names unchanged, devices as written, no colocation
    processing, no collections.

    What tf.graph_util.import_graph_def does minus its per-op Python pass
    over colocation hints and device functions (a third of its time on a
    large graph): for a GraphDef without colocation hints, where no device
    function is active, that pass changes nothing. Private API (the C import
    TensorFlow's own importer calls), used here only."""
    from tensorflow.python.client import pywrap_tf_session as c_api
    from tensorflow.python.framework import c_api_util, function, ops
    graph = ops.get_default_graph()
    scoped = c_api_util.ScopedTFImportGraphDefOptions()
    c_api.TF_ImportGraphDefOptionsSetPrefix(scoped.options, "")
    c_api.TF_ImportGraphDefOptionsSetUniquifyNames(scoped.options, True)
    c_api.TF_ImportGraphDefOptionsSetValidateColocationConstraints(scoped.options, False)
    with graph._mutation_lock():  # pylint: disable=protected-access
        buffer = c_api.TF_NewBufferFromString(serialized or graph_def.SerializeToString())
        try:
            with graph._c_graph.get() as c_graph:  # pylint: disable=protected-access
                results = c_api.TF_GraphImportGraphDefWithResults(c_graph, buffer, scoped.options)
            c_api_util.ScopedTFImportGraphDefResults(results)
        finally:
            c_api.TF_DeleteBuffer(buffer)
        _wrap_new_operations(graph)
    if graph_def.library and graph_def.library.function:
        for f in function.from_library(graph_def.library):
            f.add_to_graph(graph)


def _wrap_new_operations(graph: tf.Graph) -> None:
    """The Python Operation of every op the C import added to `graph`.

    TensorFlow's own pass (Graph._add_new_tf_operations) also applies the
    graph's active scopes to each op (attribute, kernel-label and gradient
    overrides, colocation, container, control dependencies, control-flow
    context) and reads every op's inputs to check them against those. In a
    graph where none of these scopes is active, all of that leaves the op as
    it is, and it cost 60 % of the wrapping (~0.35 s for a BERT-large graph
    of 22k ops): then only the Operation and its name's reservation are made
    here, which is what the first half of TensorFlow's pass does. Private
    API, used here only."""
    from tensorflow.python.framework import ops
    # pylint: disable=protected-access
    scoped = (graph._attr_scope_map or graph._op_to_kernel_label_map
              or graph._gradient_override_map or graph._gradient_function_map
              or graph._control_dependencies_stack or graph._colocation_stack
              or graph._container or graph._get_control_flow_context() is not None)
    if scoped:
        graph._add_new_tf_operations(compute_devices=False)
        return
    graph._check_not_finalized()
    names = graph._names_in_use
    for c_op in graph.new_operations():
        op = ops.Operation._from_c_op(c_op=c_op, g=graph)
        names.setdefault(op.name.lower(), 1)
        op._colocation_code_locations = {}
    # pylint: enable=protected-access


def meta_graph_of(graph_or_meta) -> tf1.MetaGraphDef:
    if isinstance(graph_or_meta, tf1.MetaGraphDef):
        return graph_or_meta
    # Inside the graph's context export works even when the script left eager
    # execution on (TF2's default), as a graph-mode script may. The GraphDef
    # is passed in: left to serialise the graph itself, TensorFlow 2.21's
    # export rebuilds Graph._nodes_by_id on every node access, quadratic in
    # the op count (minutes for a BERT-large training graph).
    with graph_or_meta.as_default():
        return tf1.train.export_meta_graph(
            graph=graph_or_meta, graph_def=graph_or_meta.as_graph_def(add_shapes=True),
            clear_devices=True)


def op_digraph(graph: tf.Graph, control: bool = False) -> nx.DiGraph:
    """Op-level DiGraph (producer -> consumer); control edges only if asked."""
    dg = nx.DiGraph()
    for op in graph.get_operations():
        dg.add_node(op.name)
        for t in op.inputs:
            dg.add_edge(t.op.name, op.name)
        if control:
            for c in op.control_inputs:
                dg.add_edge(c.name, op.name)
    return dg


def is_restore_assignment(op: tf.Operation) -> bool:
    """A Saver's restore assignment: its value comes (through Identity) from RestoreV2."""
    value = op.inputs[-1].op
    while value.type == "Identity" and value.inputs:
        value = value.inputs[0].op
    return value.type in ("RestoreV2", "Restore", "RestoreSlice")


def reduces_batch_axis(op: tf.Operation) -> bool:
    """Whether a reduction op (Sum, Mean: input 1 the axes) reduces axis 0,
    the batch's; a computed axis list counts (reduce_mean(x) of unknown rank
    reduces all)."""
    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if axes is None:
        return True
    axes = [int(a) for a in (axes.reshape(-1) if hasattr(axes, "reshape") else [axes])]
    return any(a == 0 or (rank is not None and a + rank == 0) for a in axes)


def stacked_terms(op: tf.Operation) -> list[tf.Tensor] | None:
    """The scalars a Sum (or Mean) of their stack adds (Keras's compute_loss
    adds the compiled loss and the regularization losses as
    ops.sum(ops.stack(...))), or None for any other op."""
    if op.type not in ("Sum", "Mean") or op.inputs[0].op.type != "Pack":
        return None
    terms = list(op.inputs[0].op.inputs)
    return terms if all(t.shape.rank == 0 for t in terms) else None


def uncast(t: tf.Tensor) -> tf.Tensor:
    """The tensor `t` is, through casts and identities."""
    while t.op.type in ("Identity", "Cast"):
        t = t.op.inputs[0]
    return t


def static_int(t: tf.Tensor) -> int | None:
    """A scalar's value when TensorFlow's static value gives it, else None."""
    value = tf.get_static_value(t)
    if value is None or np.ndim(value) != 0:
        return None
    return int(value)


# Elementwise ops folded_value computes from values TensorFlow does not fold.
_FOLDABLE = {"AddV2": np.add, "Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
             "Maximum": np.maximum, "Minimum": np.minimum, "FloorMod": np.mod,
             "FloorDiv": np.floor_divide, "GreaterEqual": np.greater_equal,
             "Greater": np.greater, "Less": np.less, "LessEqual": np.less_equal,
             "Equal": np.equal}


def folded_value(t: tf.Tensor, given: dict | None = None, depth: int = 0):
    """`t`'s value when TensorFlow's static value gives it or it is
    elementwise arithmetic of such values (tf.vectorized_map's reduction
    axes, `[0] + cast([0] >= 0)`) and of the values `given` ({tensor name:
    array}: a function of a tensor evaluated at chosen points), else None."""
    if given and t.name in given:
        return given[t.name]
    value = tf.get_static_value(t)
    if value is not None or depth > 16:
        return value
    op = t.op
    if op.type in ("Cast", "Identity") and op.inputs:
        inner = folded_value(op.inputs[0], given, depth + 1)
        return None if inner is None else np.asarray(inner).astype(t.dtype.as_numpy_dtype)
    if op.type == "Pack" and op.inputs:
        # tf.nn.softmax_cross_entropy_with_logits' slice size [rank - 1]
        parts = [folded_value(x, given, depth + 1) for x in op.inputs]
        if all(part is not None for part in parts):
            return np.stack(parts, axis=op.get_attr("axis")).astype(t.dtype.as_numpy_dtype)
        return None
    if op.type in ("Select", "SelectV2") and len(op.inputs) == 3:
        parts = [folded_value(x, given, depth + 1) for x in op.inputs]
        if all(part is not None for part in parts):
            return np.where(*parts).astype(t.dtype.as_numpy_dtype)
        return None
    if op.type in _FOLDABLE and len(op.inputs) == 2:
        a, b = (folded_value(x, given, depth + 1) for x in op.inputs)
        if a is not None and b is not None:
            return np.asarray(_FOLDABLE[op.type](a, b)).astype(t.dtype.as_numpy_dtype)
    return None


def static_shape(tensor: tf.Tensor) -> tuple[int | None, ...] | None:
    shape = tensor.shape
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def op_name_of(name: str) -> str:
    """The op a tensor name ("op:k") or a NodeDef input ("op", "op:k",
    "^op") refers to."""
    return name.lstrip("^").split(":")[0]


_ENTERS = frozenset({"Enter", "RefEnter"})
_EXITS = frozenset({"Exit", "RefExit"})
_MERGES = frozenset({"Merge", "RefMerge"})
_NEXT_ITERATIONS = frozenset({"NextIteration", "RefNextIteration"})


def v1_loop_frames(graph: tf.Graph) -> dict[str, str]:
    """{op name: the frame of the innermost TensorFlow 1 while loop it runs
    in} for every op inside one (a `tf.compat.v1.while_loop` body under
    `disable_v2_behavior()`: dynamic_rnn's), found as TensorFlow's executor
    finds frames: an Enter starts its frame_name's frame, an Exit leaves it,
    a Merge is in the frame of its input from outside the iteration, any
    other op in the frame of its first input (data, else control; a
    constant of the body has the loop's pivot as its control input)."""
    if not any(op.type in _ENTERS for op in graph.get_operations()):
        return {}
    frames: dict[str, tuple[str, ...]] = {}

    def frame_of(op: tf.Operation) -> tuple[str, ...]:
        stack = [op]
        while stack:   # inputs first, without recursion (graphs run deep)
            top = stack.pop()
            if top.name in frames:
                continue
            source = _frame_source(top)
            if source is not None and source.name not in frames:
                stack += [top, source]
                continue
            outer = frames.get(source.name, ()) if source is not None else ()
            if top.type in _ENTERS:
                frames[top.name] = outer + (top.get_attr("frame_name").decode(),)
            elif top.type in _EXITS:
                frames[top.name] = outer[:-1]
            else:
                frames[top.name] = outer
        return frames[op.name]

    return {op.name: frame[-1] for op in graph.get_operations()
            if (frame := frame_of(op))}


def _frame_source(op: tf.Operation) -> tf.Operation | None:
    """The op whose frame `op`'s frame is decided from (v1_loop_frames)."""
    inputs = [t.op for t in op.inputs]
    if op.type in _MERGES:
        inputs = [i for i in inputs if i.type not in _NEXT_ITERATIONS]
    inputs = inputs or list(op.control_inputs)
    return inputs[0] if inputs else None


def library_functions(graph_or_def) -> dict:
    """{name: FunctionDef} of the function library of a tf.Graph or a GraphDef."""
    graph_def = graph_or_def.as_graph_def() if isinstance(graph_or_def, tf.Graph) else graph_or_def
    return {f.signature.name: f for f in graph_def.library.function}


def functions_run_by(library: dict, names):
    """(name, FunctionDef) of each function of `library` (library_functions)
    that `names` name or that one of them runs, however deep, once each: the
    functions its ops' function-valued attributes name (a loop's body, a
    cond's branches, a call) and those run as an op type of their own."""
    stack, seen = list(names), set()
    while stack:
        name = stack.pop()
        if name in seen or name not in library:
            continue
        seen.add(name)
        fdef = library[name]
        yield name, fdef
        stack.extend(f.name for f in function_calls(fdef.node_def))
        stack.extend(node.op for node in fdef.node_def if node.op in library)


def function_calls(nodes):
    """The function references (NameAttrList messages, renamable in place)
    of `nodes`' function-valued attributes: a cond's branches, a loop's
    body, a call's function."""
    for node in nodes:
        for value in node.attr.values():
            yield from ([value.func] if value.HasField("func") else value.list.func)


def readers_of(graph_def) -> dict[str, list]:
    """Op name -> the NodeDefs of `graph_def` reading it (data or control
    input), in the GraphDef's order."""
    readers: dict[str, list] = {}
    for node in graph_def.node:
        for inp in node.input:
            readers.setdefault(op_name_of(inp), []).append(node)
    return readers


def node_input_name(tensor_name: str) -> str:
    """How a NodeDef input refers to a tensor: "op" for output 0, else "op:k"."""
    op, _, index = tensor_name.partition(":")
    return op if index in ("", "0") else f"{op}:{index}"


def reads_a_variable(t: tf.Tensor) -> bool:
    """Whether `t` is computed from a variable's value (a reduction of the
    model's outputs, unlike a count of the batch's labels or weights)."""
    seen, stack = set(), [t.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _VARIABLE_READS:
            return True
        if op.type not in OF_SHAPES_ALONE:
            stack.extend(x.op for x in op.inputs)
    return False
