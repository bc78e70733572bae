"""Losses normalised by a count taken from the batch's values.

A loss averaged over the tokens a mask keeps, `sum(loss * mask) /
sum(mask)`, divides by a count that depends on which examples a worker
holds: one device divides the global batch's sum by the global count, and
the mean of the workers' gradients, each divided by its own count, is not
that (a worker with few kept tokens would weigh as much as one with many).
tf.compat.v1.losses with weights builds this (SUM_BY_NONZERO_WEIGHTS, their
default, divides by the number of non-zero weights; MEAN by their sum), and
so does a Keras 3 loss over a masked sequence (each kept position weighs
size / count).

Found from data flow: the denominator of a division in the loss's forward
computation that is, up to casts and added or max'ed constants, a sum over
the batch axis of a tensor computed from the input batch's values alone
(no variable, no gradient; not just its shape, which the loss reduction
already accounts for). The rewrite makes the backward pass divide by the
count's sum over the workers, divided by the number of workers when their
gradients are averaged: worker w's gradient becomes N * grad(S_w) / (sum of
counts), whose mean over workers is one device's grad(S) / count on the
global batch. Only the backward pass reads the sum: the forward pass, and
the loss a worker reports, stay its own, so a worker can still compute the
loss alone (a collective there would wait for every worker).

A count the backward pass does not read itself may reach it through weights:
Keras 3 weighs each position a mask keeps by size / count (`total / valid`,
then a select on the mask, then times any sample weight) and the backward
pass reads the weight (the gradient of `losses * weight`). Where every
forward tensor the backward pass reads on its way to a variable's gradient
depends on the count only as count^-1 times values that do not depend on it
(through divisions by it, products with other values, selects, casts and
reshapes), the rewrite builds those tensors again from the count's sum over
workers (/ N) and the backward pass reads the copies: worker w's weight
becomes N * size_w / sum of counts, whose mean over workers is one device's
size / count after each worker's mean over its own size. Anything else on
that way (a sum, a square of the weighted loss) is refused, naming the op:
rescaling it would need the forward pass's collective.
"""
from __future__ import annotations

import tensorflow as tf

from autopar.common.errors import UnsupportedGraphError
from autopar.transforms.features.base import GraphFeature, Rewiring
from autopar.transforms.graph_utils import (INPUT_OP_TYPES, VARIABLE_OP_TYPES, in_gradient_scope,
                                            node_input_name, reduces_batch_axis)
from autopar.transforms.keys import LOSS_COUNTS
from autopar.transforms.ops import copy_op

_DIVISIONS = frozenset({"RealDiv", "Div", "DivNoNan", "TrueDiv"})
# Ops between a count and the division that keep it a count of the batch.
_UNARY = frozenset({"Identity", "Cast", "Snapshot", "StopGradient"})
_WITH_A_CONSTANT = frozenset({"Maximum", "Add", "AddV2"})
# Ops whose output depends on their input's shape only.
_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank", "OnesLike", "ZerosLike",
                         "VariableShape"})


class LossCounts(GraphFeature):
    """A loss divided by a count of the batch's values: every worker's
    backward pass divides by the count's sum over workers (over N when
    gradients are averaged)."""
    name = "loss_counts"
    fields = ("loss_counts", "loss_count_reads")
    keys = (LOSS_COUNTS,)

    def find(self, facts):
        counts, reads = find_loss_counts(facts.graph, facts.losses, INPUT_OP_TYPES,
                                         facts.gradients)
        return {"loss_counts": counts, "loss_count_reads": reads}

    def rewrite(self, ctx):
        analysis, plan = ctx.analysis, ctx.plan
        if not analysis.loss_counts:
            return None
        if ctx.micro_batches > 1:
            raise UnsupportedGraphError(
                f"the loss divides by '{analysis.loss_counts[0]}', a count of the batch's values "
                "(a mask's sum): with micro_batches > 1 each micro-batch would divide by its own "
                "count, not the global batch's. Use micro_batches=1 for this program")
        rewire, built = rewrite_loss_counts(ctx.graph, analysis.loss_counts, ctx.backend,
                                            LOSS_COUNTS,
                                            plan.num_workers if plan.averages("dense") else 1,
                                            analysis.loss_count_reads)
        return Rewiring({node_input_name(k): node_input_name(v) for k, v in rewire.items()},
                        built)

    def report_fields(self, analysis, plan):
        return {"loss_counts": analysis.loss_counts}

    def step_fetches(self, analysis):
        # this worker's counts, fetched with every step (Runner.last_loss_counts)
        return {"loss_counts": list(analysis.loss_counts)}


def find_loss_counts(graph: tf.Graph, losses: list[str | None], input_types: frozenset[str],
                     gradients: frozenset[str] = frozenset()) -> tuple[list[str], dict[str, list[str]]]:
    """The denominators (tensor names) of the divisions in the losses'
    forward computation that are counts of the batch's values, and for each
    count the backward pass does not read itself, the forward tensors
    (weights of count^-1) it reads in its place on its way to `gradients`
    (the variables' gradient tensors)."""
    out: list[str] = []
    through: dict[str, list[str]] = {}
    for loss in dict.fromkeys(x for x in losses if x):
        for op in forward_ops(graph.get_tensor_by_name(loss)):
            if op.type in _DIVISIONS and op.inputs[1].dtype.is_floating:
                den = op.inputs[1]
                if den.name in out or not _is_value_count(den, input_types):
                    continue
                if not any(in_gradient_scope(c.name) for c in den.consumers()):
                    reads, blocker = _weights_read(den, gradients)
                    if blocker is not None or not reads:
                        where = (f" ('{blocker.name}' ({blocker.type}) computes with it otherwise "
                                 "than as a weight of count^-1)" if blocker is not None else "")
                        raise UnsupportedGraphError(
                            f"the loss '{loss}' is weighted through '{op.name}' by '{den.name}', "
                            "a count of the batch's values (a mask's sum): one device counts the "
                            "global batch, each worker its share, and autopar cannot rescale a "
                            f"count the backward pass does not divide by{where}. Average the "
                            "per-position losses yourself: "
                            "tf.reduce_sum(losses * mask) / tf.reduce_sum(mask)")
                    through[den.name] = reads
                out.append(den.name)
    return out, through


# Ops through which a tensor of count^p stays one: a product with values that
# do not depend on the count, a select between it and such values, and
# casts and reshapes (input 0 carries it; a shape operand must not).
_KEEPS_POWER = frozenset({"Identity", "Cast", "Snapshot", "StopGradient", "Neg", "Reshape",
                          "ExpandDims", "Squeeze", "BroadcastTo", "Tile"})


def _weights_read(den: tf.Tensor, gradients: frozenset[str]):
    """(the forward tensors downstream of `den` that the backward pass reads
    on its way to `gradients`, None) where each is count^-1 times values
    independent of it; else (None, the op that breaks that)."""
    downstream = _downstream(den)
    reads: list[tf.Tensor] = []
    for t in [den] + [out for op in downstream.values() for out in op.outputs]:
        if any(in_gradient_scope(c.name) and c.type not in _SHAPE_ONLY and _reaches(c, gradients)
               for c in t.consumers()):
            reads.append(t)
    power: dict[str, int | None] = {den.name: 1}

    def power_of(t: tf.Tensor) -> int | None:
        """The count's power in `t` (0: independent of it), None where `t`
        is no product of a power of it and independent values."""
        if t.name in power:
            return power[t.name]
        op = t.op
        if op.name not in downstream:
            power[t.name] = 0
            return 0
        ins = [power_of(x) for x in op.inputs]
        result = None
        if None in ins:
            result = None
        elif op.type in _KEEPS_POWER and not any(ins[1:]):
            result = ins[0]
        elif op.type == "Mul" and ins.count(0) == 1:
            result = ins[0] + ins[1]
        elif op.type in _DIVISIONS and ins[0] == 0:
            result = -ins[1]
        elif op.type in _DIVISIONS and ins[1] == 0:
            result = ins[0]
        elif op.type in ("Select", "SelectV2") and ins[0] == 0 and 0 in ins[1:]:
            result = ins[1] + ins[2]
        power[t.name] = result
        if result is None and _blocker[0] is None and None not in ins:
            _blocker[0] = op
        return result

    _blocker: list[tf.Operation | None] = [None]
    for t in reads:
        if power_of(t) != -1:
            return None, _blocker[0] or t.op
    return [t.name for t in reads], None


def _reaches(op: tf.Operation, gradients: frozenset[str]) -> bool:
    """Whether one of `gradients` is computed from `op`'s outputs."""
    seen, stack = {op.name}, [op]
    while stack:
        o = stack.pop()
        for out in o.outputs:
            if out.name in gradients:
                return True
            for c in out.consumers():
                if c.name not in seen:
                    seen.add(c.name)
                    stack.append(c)
    return False


def forward_ops(t: tf.Tensor) -> list[tf.Operation]:
    """The ops `t` is computed from, not crossing a gradient scope or a variable."""
    seen, stack, out = {t.op.name}, [t.op], []
    while stack:
        op = stack.pop()
        out.append(op)
        for x in op.inputs:
            if x.op.name in seen or in_gradient_scope(x.op.name) or x.op.type in VARIABLE_OP_TYPES:
                continue
            seen.add(x.op.name)
            stack.append(x.op)
    return out


def _is_value_count(t: tf.Tensor, input_types: frozenset[str]) -> bool:
    while True:
        op = t.op
        if op.type in _UNARY:
            t = op.inputs[0]
        elif op.type in _WITH_A_CONSTANT:
            varying = [x for x in op.inputs if tf.get_static_value(x) is None]
            if len(varying) != 1:
                return False
            t = varying[0]
        else:
            break
    if t.op.type != "Sum" or not reduces_batch_axis(t.op):
        return False
    return _from_input_values(t.op.inputs[0], input_types)


def _from_input_values(t: tf.Tensor, input_types: frozenset[str]) -> bool:
    """Whether `t` is computed from an input's values (not only its shape)
    and reads no variable."""
    seen, stack, found = {t.op.name}, [t.op], False
    while stack:
        op = stack.pop()
        if op.type in VARIABLE_OP_TYPES or in_gradient_scope(op.name):
            return False
        if op.type in input_types:
            found = True
            continue
        if op.type in _SHAPE_ONLY:
            continue
        for x in op.inputs:
            if x.op.name not in seen:
                seen.add(x.op.name)
                stack.append(x.op)
    return found


def rewrite_loss_counts(graph: tf.Graph, counts: list[str], backend, keys, divisor: int,
                        reads: dict[str, list[str]] | None = None
                        ) -> tuple[dict[str, str], set[str]]:
    """Build each count's sum over workers divided by `divisor` in `graph`
    (the worker's scratch copy): a division, so that equal counts give back
    each worker's own exactly; where the backward pass reads weights of the
    count instead (`reads`: count -> those tensors), those weights again from
    it. Returns (count or weight -> replacement that the backward pass reads
    instead; the ops that keep reading the originals: those built here and
    the forward pass's)."""
    reads = reads or {}
    before = {op.name for op in graph.get_operations()}
    rewire: dict[str, str] = {}
    forward: set[str] = set()
    with tf.name_scope("autopar/loss_count/"):
        for i, name in enumerate(counts):
            count = graph.get_tensor_by_name(name)
            total = backend.allreduce_sum(tf.reshape(count, [1]), keys.key(i))
            shared = tf.reshape(total / tf.cast(divisor, count.dtype), tf.shape(count))
            targets = [graph.get_tensor_by_name(t) for t in reads.get(name, [name])]
            for t in targets:
                forward |= {c.name for c in t.consumers() if not in_gradient_scope(c.name)}
            copies = _copied_from(count, shared, targets) if name in reads else {count: shared}
            rewire.update({t.name: copies[t].name for t in targets})
    built = {op.name for op in graph.get_operations()} - before
    return rewire, built | forward


def _copied_from(count: tf.Tensor, shared: tf.Tensor, targets: list[tf.Tensor]) -> dict:
    """Each of `targets` computed again with `shared` in place of `count`: a
    copy of every forward op on a way from the count to a target, in graph
    order (their other inputs, and shapes, are read as they are)."""
    downstream = _downstream(count)
    between: set[str] = set()
    stack = [t.op for t in targets if t.op.name in downstream]
    while stack:
        op = stack.pop()
        if op.name not in between:
            between.add(op.name)
            stack.extend(x.op for x in op.inputs if x.op.name in downstream)
    copies: dict = {count: shared}
    for op in sorted((downstream[n] for n in between), key=lambda o: o._id):  # pylint: disable=protected-access
        new = copy_op(op, [copies.get(x, x) for x in op.inputs])
        copies.update(zip(op.outputs, new.outputs))
    return copies


def _downstream(count: tf.Tensor) -> dict[str, tf.Operation]:
    """The forward ops whose values are computed from `count`'s (not only
    from its shape)."""
    out: dict[str, tf.Operation] = {}
    stack = [count]
    while stack:
        for c in stack.pop().consumers():
            if c.name not in out and c.type not in _SHAPE_ONLY and not in_gradient_scope(c.name):
                out[c.name] = c
                stack.extend(c.outputs)
    return out
