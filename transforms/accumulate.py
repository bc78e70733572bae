"""Gradient accumulation over micro-batches (DropCompute, Algorithm 1).

With Config(micro_batches=M) a training step on a worker is M "accumulate"
runs, each computing one micro-batch's gradients into worker-local
accumulators, then one "apply" run (the user's train op) that aggregates the
accumulators through whatever method the Plan chose for each variable
(all-reduce, all-gather, parameter servers) and updates once.

In the rewritten graph:
  * every gradient the Analysis found gets a worker-local accumulator (a raw
    resource variable, like the PS counters: the rewrite adds no tf.Variable
    so the MetaGraphDef's collections stay valid). Dense: a tensor of the
    variable's shape. Sparse (IndexedSlices): the values and indices of every
    micro-batch concatenated, a variable with an unknown first dimension
    (assigned with validate_shape=False): sparse gradients stay sparse.
  * ACCUMULATE_FIRST assigns g * w, ACCUMULATE adds g * w (dense) or appends
    the rows (sparse); w = 1/M when the plan averages (mean loss: Algorithm 1's
    g <- g + g_m / M) and 1 when it sums. The Runner runs the first one for a
    step's first micro-batch, so no separate reset run is needed.
  * after the methods' rewrite, every node outside the backward pass and
    outside the accumulate ops that read a gradient reads its accumulator
    instead (redirect_gradients). The apply run then never reaches the
    forward/backward pass: it does not pull an input element nor need a feed.

Pure graph code, no processes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.features.base import GraphFeature, Rewiring
from autopar.transforms.graph_utils import in_gradient_scope, node_input_name, op_name_of

if TYPE_CHECKING:   # annotations only: the analysis imports the features
    from autopar.transforms.analysis import Analysis

ACCUMULATE_FIRST_OP = "autopar/accumulate/first"
ACCUMULATE_OP = "autopar/accumulate/add"


class MicroBatches(GraphFeature):
    """Config(micro_batches=M > 1): gradients accumulate in worker-local
    variables over M runs; the user's train op then applies their sum."""
    name = "micro_batches"

    def rewrite(self, ctx):
        if ctx.micro_batches <= 1:
            return None
        acc = build_accumulators(ctx.graph, ctx.analysis,
                                 micro_batch_weight(ctx.plan, ctx.micro_batches))
        return Rewiring(outputs={"accumulate_first": acc.first_op, "accumulate": acc.add_op},
                        state=acc)

    def edit_graph_def(self, graph_def, ctx, rewiring):
        # After the methods' renames and the features' rewirings, and before
        # the barrier covers the step's server work: the step then no longer
        # reaches the forward pass.
        redirect_gradients(graph_def, rewiring.state)
        check_update_reads_no_input(graph_def, rewiring.state, ctx.analysis.step_ops)


def micro_batch_weight(plan, micro_batches: int) -> float:
    """Algorithm 1's g <- g + g_m / M for a mean loss (the worker's gradient is
    then the mean over its M micro-batches, which the methods average over
    workers); a summed loss adds micro-batches as it adds workers."""
    return 1.0 / micro_batches if plan.averages("dense") else 1.0


@dataclass
class Accumulation:
    first_op: str
    add_op: str
    reads: dict[str, str] = field(default_factory=dict)   # gradient tensor -> accumulator read
    nodes: set[str] = field(default_factory=set)           # ops built here (not redirected)


def build_accumulators(graph: tf.Graph, analysis: "Analysis", weight: float) -> Accumulation:
    """The accumulators and the two accumulate ops, in `graph` (the rewrite's
    scratch graph, inside its worker device scope)."""
    n_before = len(graph.get_operations())
    firsts, adds = [], []
    reads: dict[str, str] = {}
    with tf.name_scope("autopar/accumulate/"):
        for i, info in enumerate(analysis.variables):
            if info.gradient == "dense":
                grad = graph.get_tensor_by_name(info.grad_tensor)
                handle = tf.raw_ops.VarHandleOp(dtype=grad.dtype, shape=grad.shape,
                                                shared_name=f"autopar_accumulator_{i}",
                                                name=f"acc_{i}")
                scaled = grad * tf.constant(weight, grad.dtype)
                firsts.append(tf.raw_ops.AssignVariableOp(resource=handle, value=scaled))
                adds.append(tf.raw_ops.AssignAddVariableOp(resource=handle, value=scaled))
                reads[grad.name] = tf.raw_ops.ReadVariableOp(resource=handle, dtype=grad.dtype,
                                                             name=f"sum_{i}").name
                continue
            values = graph.get_tensor_by_name(info.grad_values)
            indices = graph.get_tensor_by_name(info.grad_indices)
            scaled = values * tf.constant(weight, values.dtype)
            for tensor, part in ((scaled, "values"), (indices, "indices")):
                original = values if part == "values" else indices
                # Rows of every micro-batch appended: the first dimension grows.
                shape = tf.TensorShape([None]).concatenate(tensor.shape[1:])
                handle = tf.raw_ops.VarHandleOp(dtype=tensor.dtype, shape=shape,
                                                shared_name=f"autopar_accumulator_{i}_{part}",
                                                name=f"acc_{i}_{part}")
                old = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tensor.dtype)
                firsts.append(tf.raw_ops.AssignVariableOp(resource=handle, value=tensor,
                                                          validate_shape=False))
                adds.append(tf.raw_ops.AssignVariableOp(
                    resource=handle, value=tf.concat([old, tensor], 0), validate_shape=False))
                reads[original.name] = tf.raw_ops.ReadVariableOp(
                    resource=handle, dtype=tensor.dtype, name=f"sum_{i}_{part}").name
    first = tf.group(*firsts, name=ACCUMULATE_FIRST_OP)
    add = tf.group(*adds, name=ACCUMULATE_OP)
    nodes = {op.name for op in graph.get_operations()[n_before:]}
    return Accumulation(first.name, add.name, reads, nodes)


def redirect_gradients(graph_def, acc: Accumulation) -> int:
    """Every node outside the backward pass and the accumulate ops that reads
    a gradient reads its accumulator instead. Returns how many inputs changed."""
    rename = {node_input_name(k): node_input_name(v) for k, v in acc.reads.items()}
    changed = 0
    for node in graph_def.node:
        if node.name in acc.nodes or in_gradient_scope(node.name):
            continue
        for i, inp in enumerate(node.input):
            if inp in rename:
                node.input[i] = rename[inp]
                changed += 1
    return changed


_INPUT_OP_TYPES = frozenset({"Placeholder", "IteratorGetNext", "IteratorGetNextSync"})


def check_update_reads_no_input(graph_def, acc: Accumulation, step_ops) -> None:
    """The update (the step ops) must not reach an input the gradients are
    computed from: the apply run would pull one more tf.data element, or need
    the micro-batch feed, and compute the forward pass once more. A graph
    whose train op waits on ops of the forward pass (batch-norm moving
    averages in UPDATE_OPS, a loss fetched through control dependencies) is
    refused with the op that links them."""
    producers = {n.name: [op_name_of(i) for i in n.input] for n in graph_def.node}
    types = {n.name: n.op for n in graph_def.node}

    def ancestors(roots) -> dict[str, str | None]:
        """Every op `roots` depend on, each mapped to a consumer it was reached from."""
        seen: dict[str, str | None] = {}
        stack = [(r, None) for r in roots if r in producers]
        while stack:
            name, child = stack.pop()
            if name in seen:
                continue
            seen[name] = child
            stack.extend((p, name) for p in producers[name] if p in producers)
        return seen

    gradient_ops = {op_name_of(g) for g in acc.reads}
    inputs = {n for n in ancestors(gradient_ops) if types[n] in _INPUT_OP_TYPES}
    step = ancestors(step_ops)
    reached = sorted(inputs & set(step))
    if reached:
        # The path from the input up to a step op, for the message: its
        # start, and its end, the op of the step that reads the input.
        path, name = [], reached[0]
        while name is not None:
            path.append(name)
            name = step[name]
        shown = " -> ".join(path if len(path) <= 10 else path[:4] + ["..."] + path[-4:])
        raise UnsupportedGraphError(
            f"Config(micro_batches > 1) applies the accumulated gradients in a run of its own, "
            f"but the training step also reads the input '{reached[0]}' (through {shown}): "
            f"e.g. batch-norm moving statistics or a metric updated with the train op "
            f"(UPDATE_OPS, a Keras metric called in the step). Update such state outside the "
            f"train op, or use micro_batches=1")
