"""Functional conditionals that write variables or draw random numbers, as
Switch/Merge control flow.

Keras's LossScaleOptimizer (every Keras 3 model under the "mixed_float16"
policy) applies its inner optimizer inside `ops.cond(all gradients finite,
apply, halve the scale)`. A tf.function traces that to an `If` op whose
branches are functions of the graph's library: the variable writes inside
them are no nodes of the graph, so the data-flow analysis finds no update at
all. Lowering such an If into the graph, as TensorFlow's runtime itself does
before it runs a graph (lower_if_op.cc), makes the branches' ops ordinary
nodes, each executed only when its branch is taken:

  <if>/lowered/switch_pred  Switch(pred, pred); <if>/lowered/pivot_t and
                            pivot_f: Identities of its true and false output
  <if>/then/<node>, <if>/else/<node>
                            the branch function's nodes, each with a control
                            input from its branch's pivot, so that it is dead
                            when the other branch is taken; they read the
                            If's inputs directly (no Switch per input), so a
                            variable's write still takes the variable's own
                            handle, as everywhere else in a graph
  <if>/<branch>/output_<j>  Identity of the branch's j-th result, after its
                            stateful ops (the function's control outputs)
  <if>/lowered/merge_<j>    Merge of the two branches' j-th results
  <if>                      IdentityN of the merges (NoOp without results),
                            after the taken branch's stateful ops, under the
                            If's own name: what read or waited for the If
                            reads or waits for it unchanged.

A traced step is lowered when it is lifted (transforms.lift); a
tf.compat.v1 graph whose conds are functional (control flow v2, TensorFlow
2's default) is copied with them lowered (`lowered_graph`).

The same holds for a random draw inside a branch: a TF1 program's dropout
under `tf.cond(is_training, ...)` (what tf.compat.v1.layers.dropout builds
for a `training` tensor) draws its mask in a function body, where the
analysis cannot make each worker draw its own examples' rows
(transforms.random_draws); lowered, the draw is a node of the graph.

A nested If (the loss scale's own growth cond inside the finite branch) is
an ordinary If node once its parent is lowered, and is lowered in turn. Only
Ifs whose branches write a variable or draw random numbers are lowered: any
other (a model's forward cond) stays one op, as the analysis knows it.
"""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.graph_utils import (function_calls, import_meta_graph, library_functions,
                                            writes_variable)
from autopar.transforms.ops import attr_value
from autopar.transforms.random_draws import draws_randomly

tf1 = tf.compat.v1

# Rounds of lowering (each lowers every such If of the graph as it is,
# exposing the next level of nesting); no real program nests conds this deep.
_MAX_NESTING = 32


def lower_conds(graph_def: graph_pb2.GraphDef) -> graph_pb2.GraphDef:
    """`graph_def` with every If whose branches write a variable or draw
    random numbers lowered (module docstring); `graph_def` itself when there
    is none."""
    functions = library_functions(graph_def)
    stateful = _functions_with_state(functions)
    out = graph_def
    for _ in range(_MAX_NESTING):
        targets = [n for n in out.node if _lowerable(n, stateful)]
        if not targets:
            return out
        if out is graph_def:
            out = graph_pb2.GraphDef()
            out.CopyFrom(graph_def)
        names = {n.name for n in targets}
        kept = [n for n in out.node if n.name not in names]
        lowered = []
        for node in targets:
            lowered.extend(_lowered(node, functions))
        del out.node[:]
        out.node.extend(kept + lowered)
    raise UnsupportedGraphError(f"tf.conds that write variables or draw random numbers are "
                                f"nested more than {_MAX_NESTING} deep: autopar lowers at most "
                                "that many levels")


def lowered_graph(graph: tf.Graph) -> tf.Graph:
    """`graph` with its Ifs that write or draw lowered, as a new graph with the same
    collections (a tf.compat.v1 graph built in control flow v2, TensorFlow
    2's default: MixedPrecisionLossScaleOptimizer's cond); `graph` itself
    when it has none. Ops keep their names, so a Runner maps the caller's
    tensors and ops onto it by name."""
    if not any(op.type == "If" for op in graph.get_operations()):
        return graph
    graph_def = graph.as_graph_def()
    lowered = lower_conds(graph_def)
    if lowered is graph_def:
        return graph
    # A collection holding an op of a branch's own graph (the train_op
    # collection, when minimize() ran inside a cond) names no node of the
    # graph: it is not carried over.
    keys = [key for key in graph.get_all_collection_keys()
            if all(getattr(item, "graph", graph) is graph for item in graph.get_collection(key))]
    with graph.as_default():
        meta = tf1.train.export_meta_graph(graph=graph, graph_def=lowered, clear_devices=False,
                                           collection_list=keys)
    out = tf.Graph()
    with out.as_default():
        import_meta_graph(meta)
    return out


def _lowerable(node, stateful: set[str]) -> bool:
    return (node.op == "If" and node.attr["Tcond"].type == types_pb2.DT_BOOL
            and bool({node.attr["then_branch"].func.name,
                      node.attr["else_branch"].func.name} & stateful))


def _functions_with_state(functions: dict) -> set[str]:
    """Names of the library functions whose bodies write a variable or draw
    random numbers, directly or through a function they run."""
    calls = {name: {c.name for c in function_calls(f.node_def) if c.name in functions}
             for name, f in functions.items()}
    stateful = {name for name, f in functions.items()
                if any(writes_variable(n.op) or draws_randomly(n.op) for n in f.node_def)}
    changed = True
    while changed:
        changed = False
        for name, callees in calls.items():
            if name not in stateful and callees & stateful:
                stateful.add(name)
                changed = True
    return stateful


def _node(name: str, op: str, inputs: list[str], device: str, **attrs) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op, input=inputs, device=device)
    for key, value in attrs.items():
        node.attr[key].CopyFrom(attr_value(key, value))
    return node


def _lowered(node, functions: dict) -> list[node_def_pb2.NodeDef]:
    name, device = node.name, node.device
    data = [i for i in node.input if not i.startswith("^")]
    control = [i for i in node.input if i.startswith("^")]
    pred, args = data[0], data[1:]
    out_types = [tf.as_dtype(t) for t in node.attr["Tout"].list.type]
    lowered_scope = f"{name}/lowered"
    nodes = [_node(f"{lowered_scope}/switch_pred", "Switch", [pred, pred] + control, device,
                   T=tf.bool)]
    executed = []
    results: list[list[str]] = []
    for branch, port, attr in (("then", 1, "then_branch"), ("else", 0, "else_branch")):
        pivot = f"{lowered_scope}/pivot_{branch[0]}"
        nodes.append(_node(pivot, "Identity", [f"{lowered_scope}/switch_pred:{port}"], device,
                           T=tf.bool))
        body, outputs, stateful = _inlined(functions[node.attr[attr].func.name],
                                           f"{name}/{branch}", args, pivot, device)
        nodes.extend(body)
        after = [f"^{pivot}"] + [f"^{s}" for s in stateful]
        results.append([])
        for j, (tensor, dtype) in enumerate(zip(outputs, out_types)):
            out = f"{name}/{branch}/output_{j}"
            nodes.append(_node(out, "Identity", [tensor] + after, device, T=dtype))
            results[-1].append(out)
        done = f"{name}/{branch}/executed"
        nodes.append(_node(done, "Identity", [pivot] + after[1:], device, T=tf.bool))
        executed.append(done)
    merges = []
    for j, dtype in enumerate(out_types):
        merge = f"{lowered_scope}/merge_{j}"
        nodes.append(_node(merge, "Merge", [results[0][j], results[1][j]], device, T=dtype, N=2))
        merges.append(merge)
    branch_executed = f"{lowered_scope}/branch_executed"
    nodes.append(_node(branch_executed, "Merge", executed, device, T=tf.bool, N=2))
    if merges:
        nodes.append(_node(name, "IdentityN", merges + [f"^{branch_executed}"], device, T=out_types))
    else:
        nodes.append(_node(name, "NoOp", [f"^{branch_executed}"], device))
    return nodes


def _inlined(fdef, scope: str, args: list[str], pivot: str, device: str):
    """(the nodes of `fdef`'s body under `scope`, each after `pivot` and
    reading `args` for the function's arguments; the body's results as
    tensor names; its stateful ops' names)."""
    body, flat = function_def_to_graph_def(fdef)
    arg_names = [a.name for a in fdef.signature.input_arg]
    if len(arg_names) != len(args):
        raise UnsupportedGraphError(f"the cond's branch '{fdef.signature.name}' takes "
                                    f"{len(arg_names)} inputs, its If passes {len(args)}")
    bound = dict(zip(arg_names, args))

    def renamed(tensor: str) -> str:
        control = tensor.startswith("^")
        op, _, port = tensor.lstrip("^").partition(":")
        if op in bound:
            outer = bound[op]
            return "^" + outer.partition(":")[0] if control else outer
        op = f"{scope}/{op}"
        return "^" + op if control else (f"{op}:{port}" if port else op)

    nodes = []
    for n in body.node:
        if n.name in bound:
            continue
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(n)
        copy.name = f"{scope}/{n.name}"
        del copy.input[:]
        copy.input.extend([renamed(i) for i in n.input] + [f"^{pivot}"])
        # Colocation hints name the body's own nodes and arguments (the
        # placement decides devices here); an import would reject them.
        if "_class" in copy.attr:
            del copy.attr["_class"]
        if not copy.device:
            copy.device = device
        nodes.append(copy)
    outputs = []
    for arg in fdef.signature.output_arg:
        ret = fdef.ret[arg.name]
        outputs.append(renamed(flat.get(ret, ret)))
    stateful = [f"{scope}/{op}" for op in fdef.control_ret.values()]
    return nodes, outputs, stateful
