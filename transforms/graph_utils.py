"""Small helpers on TensorFlow graphs shared by analysis, plan and rewrite.

Kept in one place so every transform agrees on what a "gradient op", a
"variable op" or a tensor name is.
"""
from __future__ import annotations

import re

import networkx as nx
import tensorflow as tf

tf1 = tf.compat.v1

# tf.gradients puts everything it builds under a name scope called
# "gradients" (or "gradients_1", ... when several exist), possibly nested in a
# user scope. That scope is the only reliable marker of the backward pass in a
# GraphDef, so the boundary between "computing gradients" and "using them" is
# drawn there.
_GRAD_SCOPE = re.compile(r"^gradients(_\d+)?$")

VARIABLE_OP_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable"})


def in_gradient_scope(op_name: str) -> bool:
    if "gradients" not in op_name:   # the common case, without splitting the name
        return False
    return any(_GRAD_SCOPE.match(part) for part in op_name.split("/")[:-1])


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
        graph._add_new_tf_operations(compute_devices=False)  # pylint: disable=protected-access
    if graph_def.library and graph_def.library.function:
        for f in function.from_library(graph_def.library):
            f.add_to_graph(graph)


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


def static_shape(tensor: tf.Tensor) -> tuple[int | None, ...] | None:
    shape = tensor.shape
    if shape.rank is None:
        return None
    return tuple(shape.as_list())


def node_input_name(tensor_name: str) -> str:
    """How a NodeDef input refers to a tensor: "op" for output 0, else "op:k"."""
    op, _, index = tensor_name.partition(":")
    return op if index in ("", "0") else f"{op}:{index}"
