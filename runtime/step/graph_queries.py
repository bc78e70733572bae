"""What the step loop asks of a graph: its variable initialisers, the
tf.data iterator a fetch reads, the ops whose run writes a trainable
variable, a traced function's writes that wait for no input, and the
variables alone a tensor is computed from."""
from __future__ import annotations

import networkx as nx
import tensorflow as tf

from autopar.common.roles import SERVER_JOB
from autopar.transforms.graph_utils import is_restore_assignment, op_digraph
from autopar.transforms.lift import CALL_OP

tf1 = tf.compat.v1

_ITERATOR_OPS = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})

# Ops that write state: a variable, or a random generator's.
_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                     "RngReadAndSkip", "RngSkip"})

_UPDATE_PREFIXES = ("Assign", "Apply", "ResourceApply", "SparseApply", "ResourceSparseApply",
                    "Scatter", "ResourceScatter")


def graph_variables(graph: tf.Graph) -> list:
    """The graph's global and local variables."""
    return (graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
            + graph.get_collection(tf1.GraphKeys.LOCAL_VARIABLES))


def initializer_ops(graph: tf.Graph) -> frozenset[str]:
    """Variable initializers and the grouping ops made only of them
    (tf.compat.v1.global_variables_initializer() and friends)."""
    names = {v.initializer.name for v in graph_variables(graph)}
    for op in graph.get_operations():
        if (op.type == "NoOp" and op.control_inputs and not op.inputs
                and all(c.name in names for c in op.control_inputs)):
            names.add(op.name)
    return frozenset(names)


def upstream(ops):
    """`ops` and every op they depend on (by data or control edges), each once."""
    seen: set[str] = set()
    stack = list(ops)
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        yield op
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)


# Reads of a variable's value: where variables_computed_from stops.
_READS = frozenset({"ReadVariableOp"})
# Ops computing from their inputs alone (no state, no draw): what may lie
# between the reads and the tensor.
_STATELESS_OK = frozenset({"Const", "Identity", "Cast", "DivNoNan", "RealDiv", "Div", "Mul",
                           "Add", "AddV2", "Sub", "Neg", "Maximum", "Minimum", "Sqrt", "Square",
                           "Reshape", "Squeeze", "ExpandDims", "Pack", "ConcatV2", "Sum",
                           "Mean", "StridedSlice", "Shape", "Size", "Fill", "ZerosLike",
                           "OnesLike", "Reciprocal", "Exp", "Log", "Abs", "Pow"})


def variables_computed_from(tensor: tf.Tensor) -> set[str] | None:
    """The variables (their handles' op names) whose values alone `tensor`
    is computed from, following data edges from it through reads of them
    and stateless arithmetic: a metric's result(), its total over its
    count. None when it also depends on anything else (an input of the
    step, a placeholder, a random draw, a table), or on no variable."""
    read: set[str] = set()
    seen: set[str] = set()
    stack = [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type in _READS:
            handle = op.inputs[0].op
            if handle.type != "VarHandleOp":
                return None
            read.add(handle.name)
        elif op.type in _STATELESS_OK:
            stack.extend(t.op for t in op.inputs)
        else:
            return None
    return read or None


def iterator_read_by(tensors) -> tf.Operation | None:
    """A tf.data iterator's get-next op that `tensors` (or ops) depend on (by
    data or control edges), or None."""
    return next((op for op in upstream(getattr(t, "op", t) for t in tensors)
                 if op.type in _ITERATOR_OPS), None)


def reads_iterator(tensors) -> bool:
    return iterator_read_by(tensors) is not None


def input_free_writes(graph: tf.Graph, is_chief: bool) -> list[tf.Operation]:
    """The writes among the traced function's stateful ops (CALL_OP's
    inputs) that depend, by data or control, on no fed value (its inputs,
    the runner's own feeds), no dataset and no collective; those of a
    server's variable on the chief alone."""
    if CALL_OP not in {op.name for op in graph.get_operations()}:
        return []
    # everything downstream of what a step reads or exchanges
    tainted: set[str] = set()
    stack = [op for op in graph.get_operations()
             if op.type in ("Placeholder", "PlaceholderWithDefault", "IteratorGetNext",
                            "IteratorGetNextSync") or op.type.startswith("Collective")]
    while stack:
        op = stack.pop()
        if op.name in tainted:
            continue
        tainted.add(op.name)
        stack.extend(c for t in op.outputs for c in t.consumers())
        stack.extend(op._control_outputs)  # pylint: disable=protected-access  (no public API)
    return [op for op in upstream([graph.get_operation_by_name(CALL_OP)])
            if op.type in _WRITES and op.name not in tainted
            and (is_chief or f"/job:{SERVER_JOB}" not in op.device)]


def trainable_writer_step_ops(graph: tf.Graph, init_ops: frozenset[str]) -> frozenset[str]:
    """Ops whose run writes a trainable variable (the writers and everything
    depending on them by data or control edges), initialisers and checkpoint
    restores excluded."""
    trainable = {v.op.name for v in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)}
    writers = [op.name for op in graph.get_operations()
               if op.type.startswith(_UPDATE_PREFIXES) and op.inputs
               and op.inputs[0].op.name in trainable and op.name not in init_ops
               and not is_restore_assignment(op)]
    if not writers:
        return frozenset()
    full = op_digraph(graph, control=True)
    return frozenset(writers).union(*(nx.descendants(full, w) for w in writers))
